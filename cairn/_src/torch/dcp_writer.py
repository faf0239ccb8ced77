"""``cairn.torch.FileSystemWriter``: PyTorch DCP's ``FileSystemWriter`` that hashes every
file as it writes it, so that registering the checkpoint with Cairn reads nothing again.

A checkpoint that ``torch.distributed.checkpoint`` wrote is registered by reference
(``report(checkpoint=..., checkpoint_upload_mode=NO_UPLOAD)``, or a
``checkpoint_upload_fn``), and the controller then reads every byte once more to
checksum it for the manifest. With this writer each rank's background write computes the
XXH3-128 of its files on the way to the disk (the hash runs at memory speed, without the
GIL), and :meth:`FileSystemWriter.checkpoint` returns the :class:`cairn.Checkpoint` that
carries those entries. The commit takes an entry only for a regular file that is still
the one the writer closed (same size, modification time and inode; see
``cairn._src.storage.written``), and reads and hashes any other as before. A save whose
writer runs in another process (``async_save(..., async_checkpointer_type=PROCESS)``) gets
no entries back: the commit hashes its files.

Thread-safety: DCP writes files from its own threads (``thread_count``); the records are
kept under a lock. :meth:`checkpoint` is called once the save is done.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Generator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.filesystem import FileSystemWriter as _DCPFileSystemWriter

from cairn._src.checkpoint.checkpoint import Checkpoint
from cairn._src.storage.checksum import FileEntry, WrittenFile, new_hasher
from cairn._src.storage.durability import fsync_path

__all__ = ["FileSystemWriter"]


class _HashingStream:
    """The file DCP writes through: every byte goes to the hasher, then to the file.

    DCP writes its files front to back (``write``, ``tell``, ``flush``, ``fileno`` for
    ``fsync``); any other use (a ``seek``) drops the checksum, and the commit reads the
    file instead."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw
        self._hasher = new_hasher()
        self.size = 0
        self.intact = True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._hasher.update(view)
        written = self._raw.write(view)
        if written is not None and written != len(view):
            self.intact = False
        self.size += len(view)
        return len(view)

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return int(self._raw.tell())

    def flush(self) -> None:
        self._raw.flush()

    def fileno(self) -> int:
        # DCP fsyncs the descriptor right after pickle.dump(metadata, stream), without a
        # flush: what the buffer holds must reach the file before that fsync.
        self._raw.flush()
        return int(self._raw.fileno())

    def seek(self, *args: Any) -> int:
        self.intact = False
        return int(self._raw.seek(*args))

    def close(self) -> None:
        self._raw.close()

    @property
    def closed(self) -> bool:
        return bool(self._raw.closed)

    def entry(self) -> FileEntry:
        return FileEntry(self.size, self._hasher.hexdigest())


class _HashingFileSystem(FileSystem):
    """DCP's local file system, recording a :class:`WrittenFile` for every file written
    whole (by absolute path; moved by ``rename``, dropped by ``rm_file``)."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._written: dict[str, WrittenFile] = {}
        self._created: set[str] = set()  # directories this file system made

    def mkdir(self, path: str | os.PathLike[str]) -> None:
        made = []
        parent = os.path.abspath(os.fspath(path))
        while not os.path.isdir(parent) and os.path.dirname(parent) != parent:
            made.append(parent)
            parent = os.path.dirname(parent)
        super().mkdir(path)
        with self._lock:
            self._created.update(made)

    def sync_directories(self, directory: str) -> None:
        """fsync ``directory`` (its files' entries, the ``.metadata`` rename), then the
        directory holding it and every other directory that holds one this file system
        made (their new entries): DCP fsyncs its files, never a directory."""
        with self._lock:
            created = set(self._created)
        holders = {os.path.dirname(d) for d in created | {directory}}
        for path in [directory, *sorted(holders, key=lambda d: (-d.count(os.sep), d))]:
            fsync_path(path)

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str,
                      ) -> Generator[Any, None, None]:
        if mode != "wb":
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        key = os.path.abspath(os.fspath(path))
        self._forget(key)
        with Path(key).open("wb") as raw:
            hashing = _HashingStream(raw)
            yield hashing
        if hashing.intact:
            found = os.stat(key)
            if found.st_size == hashing.size:
                with self._lock:
                    self._written[key] = WrittenFile(hashing.entry(), found.st_mtime_ns,
                                                     found.st_ino)

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        old, new = os.path.abspath(os.fspath(path)), os.path.abspath(os.fspath(new_path))
        with self._lock:
            record = self._written.pop(old, None)
            self._written.pop(new, None)
        super().rename(path, new_path)
        if record is not None:
            # A rename keeps the inode and the modification time.
            with self._lock:
                self._written[new] = record

    def rm_file(self, path: str | os.PathLike[str]) -> None:
        self._forget(os.path.abspath(os.fspath(path)))
        super().rm_file(path)

    def __getstate__(self) -> dict[str, Any]:
        # Pickled with its writer into DCP's checkpoint process: the records made there
        # stay there (the commit hashes those files).
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]

    def _forget(self, key: str) -> None:
        with self._lock:
            self._written.pop(key, None)

    def forget_all(self) -> None:
        with self._lock:
            self._written.clear()

    def written_under(self, directory: str) -> dict[str, WrittenFile]:
        """The records of files under ``directory``, by path relative to it."""
        prefix = directory.rstrip(os.sep) + os.sep
        with self._lock:
            return {key[len(prefix):].replace(os.sep, "/"): record
                    for key, record in self._written.items() if key.startswith(prefix)}


class FileSystemWriter(_DCPFileSystemWriter):
    """``torch.distributed.checkpoint.FileSystemWriter`` (same arguments, same files) that
    checksums each file as it writes it; pass it as ``storage_writer`` to ``dcp.save`` or
    ``dcp.async_save``, and report :meth:`checkpoint` once the save is done::

        writer = cairn.torch.FileSystemWriter(path)
        future = dcp.async_save(state, storage_writer=writer)
        ...
        future.result()
        cairn.report(metrics, checkpoint=writer.checkpoint(),
                     checkpoint_upload_mode=cairn.CheckpointUploadMode.NO_UPLOAD)

    The commit then takes the checksums instead of reading the files again. A writer
    serves one save at a time: a new save (DCP calls ``reset``) forgets the records of the
    one before.
    """

    def __init__(self, path: str | os.PathLike[str], single_file_per_rank: bool = True,
                 sync_files: bool = True, thread_count: int = 1,
                 per_thread_copy_ahead: int = 10_000_000,
                 cache_staged_state_dict: bool = False, overwrite: bool = True,
                 _extensions: Sequence[Any] | None = None, **kwargs: Any) -> None:
        super().__init__(path, single_file_per_rank=single_file_per_rank,
                         sync_files=sync_files, thread_count=thread_count,
                         per_thread_copy_ahead=per_thread_copy_ahead,
                         cache_staged_state_dict=cache_staged_state_dict,
                         overwrite=overwrite, _extensions=_extensions, **kwargs)
        self._hashing = _HashingFileSystem()
        self.fs = self._hashing

    def finish(self, metadata: Any, results: Any) -> None:
        super().finish(metadata, results)
        if self.sync_files:
            self._hashing.sync_directories(os.path.abspath(os.fspath(self.path)))

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        super().reset(checkpoint_id)
        self._hashing.forget_all()

    def checkpoint(self) -> Checkpoint:
        """The :class:`cairn.Checkpoint` of the directory this writer wrote, carrying the
        checksums computed while writing (none for a save written in another process)."""
        directory = os.path.abspath(os.fspath(self.path))
        return Checkpoint._as_written(directory, self._hashing.written_under(directory))
