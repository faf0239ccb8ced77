"""The protocol a custom store implements, and its adapter to ``pyarrow.fs``.

A custom store is a flat map from string keys to immutable objects: five methods, no
directories, no renames, no partial writes. :func:`object_store_filesystem` adapts one to
a ``pyarrow.fs.FileSystem`` so that the rest of Cairn sees every backend the same way.

Mapping: a path in the adapted file system is a key; leading and trailing slashes are
dropped (``/bucket/a/b`` and ``bucket/a/b`` are key ``bucket/a/b``). Directories are
implicit: ``bucket/a`` is a directory when some key starts with ``bucket/a/``. Creating a
directory does nothing; deleting one deletes every key under it.
"""

from __future__ import annotations

import io
import logging
import tempfile
from collections.abc import Iterable
from typing import Any, BinaryIO, NamedTuple, Protocol, runtime_checkable

import fsspec
import pyarrow as pa
import pyarrow.fs as pafs

logger = logging.getLogger(__name__)

# Output streams keep this much in memory before spilling to a temporary file: small
# files (manifests, metadata) never touch the disk, large ones do not fill the memory.
SPILL_THRESHOLD_BYTES = 8 * 1024 * 1024


class ObjectInfo(NamedTuple):
    """One stored object: its key and size in bytes."""

    key: str
    size: int


@runtime_checkable
class ObjectStore(Protocol):
    """What a custom store implements. Methods may be called from several threads at once.

    Raise :class:`~cairn.storage.TransientStorageError` (or ``TimeoutError`` /
    ``ConnectionError``) for errors a retry may fix; Cairn retries them with backoff.
    Any other exception is treated as permanent.
    """

    def open_read(self, key: str) -> BinaryIO:
        """A readable binary stream of the object; ``FileNotFoundError`` when missing."""
        ...

    def write(self, key: str, stream: BinaryIO) -> None:
        """Store everything ``stream`` yields as the object ``key``, replacing any.

        Must be atomic: readers see the old object or the whole new one, never a part.
        """
        ...

    def list(self, prefix: str) -> Iterable[ObjectInfo]:
        """Every object whose key starts with ``prefix`` (recursively), with sizes."""
        ...

    def delete(self, key: str) -> None:
        """Remove the object; a missing key is not an error."""
        ...

    def stat(self, key: str) -> ObjectInfo | None:
        """The object's info, or ``None`` when there is no object with this exact key."""
        ...


def is_object_store(obj: object) -> bool:
    """Whether ``obj`` has the five methods of :class:`ObjectStore`."""
    if isinstance(obj, (pafs.FileSystem, fsspec.AbstractFileSystem)):
        return False
    return isinstance(obj, ObjectStore)


def object_store_filesystem(store: ObjectStore) -> pafs.PyFileSystem:
    """Adapt ``store`` to a ``pyarrow.fs.FileSystem`` (see the module docstring for paths).

    The result pickles when ``store`` does.
    """
    return pafs.PyFileSystem(ObjectStoreHandler(store))


def _key(path: str) -> str:
    return path.strip("/")


class _UploadOnClose(io.RawIOBase):
    """A write-only stream that hands its whole content to ``store.write`` on close."""

    def __init__(self, store: ObjectStore, key: str) -> None:
        super().__init__()
        self._store = store
        self._key = key
        self._spool: Any = tempfile.SpooledTemporaryFile(max_size=SPILL_THRESHOLD_BYTES)

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self._spool.write(view)
        return view.nbytes

    def close(self) -> None:
        if self.closed:
            return
        try:
            self._spool.seek(0)
            self._store.write(self._key, self._spool)
        finally:
            self._spool.close()
            super().close()


class ObjectStoreHandler(pafs.FileSystemHandler):  # type: ignore[misc]
    """``pyarrow.fs.FileSystemHandler`` over an :class:`ObjectStore`."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectStoreHandler) and other.store is self.store

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return id(self.store)

    def get_type_name(self) -> str:
        return f"cairn-object-store:{type(self.store).__name__}"

    def normalize_path(self, path: str) -> str:
        return _key(path)

    def _info(self, path: str) -> pafs.FileInfo:
        key = _key(path)
        if not key:
            return pafs.FileInfo(path, pafs.FileType.Directory)
        found = self.store.stat(key)
        if found is not None:
            return pafs.FileInfo(path, pafs.FileType.File, size=found.size)
        for _ in self.store.list(key + "/"):
            return pafs.FileInfo(path, pafs.FileType.Directory)
        return pafs.FileInfo(path, pafs.FileType.NotFound)

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        return [self._info(path) for path in paths]

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        base = _key(selector.base_dir)
        prefix = f"{base}/" if base else ""
        objects = list(self.store.list(prefix))
        if not objects and base:
            if self.store.stat(base) is not None:
                raise NotADirectoryError(f"{selector.base_dir!r} is an object, not a directory")
            if not selector.allow_not_found:
                raise FileNotFoundError(f"{selector.base_dir!r} does not exist")
        infos: dict[str, pafs.FileInfo] = {}
        for obj in objects:
            rest = obj.key[len(prefix):]
            if not rest:
                continue
            parts = rest.split("/")
            # Every prefix of the key is an implicit directory.
            for depth in range(1, len(parts)):
                if not selector.recursive and depth > 1:
                    break
                name = prefix + "/".join(parts[:depth])
                infos.setdefault(name, pafs.FileInfo(name, pafs.FileType.Directory))
            if selector.recursive or len(parts) == 1:
                infos[obj.key] = pafs.FileInfo(obj.key, pafs.FileType.File, size=obj.size)
        return [infos[name] for name in sorted(infos)]

    def create_dir(self, path: str, recursive: bool) -> None:
        """Directories are implicit in an object store: nothing to create."""

    def _delete_prefix(self, prefix: str) -> None:
        for obj in list(self.store.list(prefix)):
            self.store.delete(obj.key)

    def delete_dir(self, path: str) -> None:
        key = _key(path)
        self._delete_prefix(f"{key}/" if key else "")

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self.delete_dir(path)

    def delete_root_dir_contents(self) -> None:
        self._delete_prefix("")

    def delete_file(self, path: str) -> None:
        self.store.delete(_key(path))

    def move(self, src: str, dest: str) -> None:
        # Object stores cannot rename: copy, then delete. Not atomic; Cairn only moves
        # where supports_atomic_rename() says the backend can.
        self.copy_file(src, dest)
        self.store.delete(_key(src))

    def copy_file(self, src: str, dest: str) -> None:
        with self.store.open_read(_key(src)) as stream:
            self.store.write(_key(dest), stream)

    def open_input_stream(self, path: str) -> pa.NativeFile:
        return pa.PythonFile(self.store.open_read(_key(path)), mode="r")

    def open_input_file(self, path: str) -> pa.NativeFile:
        stream = self.store.open_read(_key(path))
        seekable = getattr(stream, "seekable", None)
        if seekable is None or not seekable():
            # Random access needs seeks; a plain stream is read whole into memory.
            with stream:
                stream = io.BytesIO(stream.read())
        return pa.PythonFile(stream, mode="r")

    def open_output_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        return pa.PythonFile(_UploadOnClose(self.store, _key(path)), mode="w")

    def open_append_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        raise NotImplementedError(
            "Custom object stores do not support appends; write whole objects instead."
        )
