"""A deferred checkpoint (an in-memory snapshot) serialized straight into its destination.

``report_snapshot`` hands the upload thread a copy of the state. Serializing it into a
temporary directory and then uploading that directory would write every byte twice (and
read it once more to hash it). Here each file is serialized once, into the checkpoint's
own (uncommitted) directory on storage: a local file opened without following links, or a
remote output stream (a multipart upload on object stores), through a sink that hashes
the bytes as they pass. A file another rank writes (a duplicate the controller named) is
serialized into the hasher only. A file that fails is written again from the start, per
the run's retry budget; with ``StorageOptions.fsync`` the written files and their
directories are fsynced before they are announced (:mod:`cairn._src.storage.durability`).

Runs on the upload thread of a worker; one file at a time (the serializer holds the GIL
for its pickling, so more threads would only take turns).

Priority adapts to the backlog: the upload thread is niced (it takes the cores the train
loop leaves), which is right for a write that finishes soon, but beside a busy loop (or a
busy machine) it stretched a 2 s commit to 16 s, and the next snapshot waits for it. A
write still running ``ESCALATE_AFTER_S`` after it began takes the train loop's own
priority for the rest of it (:class:`AdaptivePriority`), where the OS lets a thread lower
its niceness again (Linux: ``CAP_SYS_NICE``, as root in most containers, or an
``RLIMIT_NICE`` that allows it); elsewhere it stays niced.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO, Protocol

from cairn._src.errors import ReportError
from cairn._src.storage import tuning
from cairn._src.storage.checksum import FileEntry, new_hasher
from cairn._src.storage.fileio import needs_directories, storage_call
from cairn._src.storage.local_files import create_or_truncate
from cairn._src.storage.location import StorageLocation
from cairn._src.storage.options import StorageOptions
from cairn._src.storage.parallel import with_retry
from cairn._src.storage.reader import local_os_path
from cairn._src.wire.messages import ProceedMessage, UploadedMessage, driver_copy_cost
from cairn._src.worker.upload_job import UploadJob, sync_written

logger = logging.getLogger(__name__)

# How long a snapshot's write runs niced before it takes the train loop's priority.
ESCALATE_AFTER_S = 1.0

# The most one write() hands the sink at once: a tensor record of several GiB is cut so
# that a remote stream buffers at most this much beyond its parts in flight.
_WRITE_BYTES = 16 << 20


class DirectWriter(Protocol):
    """What a deferred report writes: ``write_file(rel, sink)`` serializes one of its
    files into a binary sink (called again from the start for a retry), ``close()`` frees
    what it holds once every file is written or the upload failed."""

    def names(self) -> list[str]: ...

    def write_file(self, rel: str, sink: BinaryIO) -> None: ...

    def close(self) -> None: ...


class WriterKeeper(Protocol):
    """Takes a written :class:`DirectWriter` over (True) instead of its being closed."""

    def hold(self, report_index: int, writer: DirectWriter,
             entries: dict[str, FileEntry]) -> bool: ...


class AdaptivePriority:
    """The calling thread's CPU priority during one write: as it was (niced) until
    ``after_s`` have passed, then the process's main thread's; :meth:`restore` puts the
    first back. Call :meth:`check` between pieces of work; only the thread that made it
    may use it. Silently nothing where threads have no niceness of their own or the OS
    refuses to lower it."""

    def __init__(self, after_s: float) -> None:
        self._deadline = time.perf_counter() + after_s
        self._thread = threading.get_native_id()
        self._original: int | None = None
        self._done = not sys.platform.startswith("linux")

    def check(self) -> None:
        if self._done or time.perf_counter() < self._deadline:
            return
        self._done = True
        try:
            current = os.getpriority(os.PRIO_PROCESS, self._thread)
            loop = os.getpriority(os.PRIO_PROCESS, os.getpid())  # the main thread's
            if loop < current:
                os.setpriority(os.PRIO_PROCESS, self._thread, loop)
                self._original = current
                logger.debug("A snapshot write past %.1fs took the train loop's priority "
                             "(niceness %d, was %d)", ESCALATE_AFTER_S, loop, current)
        except (AttributeError, OSError):
            pass  # no per-thread niceness, or lowering it is not allowed: stay niced

    def restore(self) -> None:
        if self._original is not None:
            try:
                os.setpriority(os.PRIO_PROCESS, self._thread, self._original)
            except OSError:
                pass
            self._original = None


class HashingSink:
    """A write-only binary file: each write is hashed, counted and passed to ``target``
    (None: hash only). ``flush_every``: a remote stream is flushed each time that many
    more bytes went through it, so that its background parts do not pile up."""

    def __init__(self, target: Any, *, flush_every: int | None = None,
                 priority: AdaptivePriority | None = None) -> None:
        self._target = target
        self._priority = priority
        self._hasher = new_hasher()
        self._flush_every = flush_every
        self._unflushed = 0
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        total = len(view)
        for start in range(0, total, _WRITE_BYTES):
            if self._priority is not None:
                self._priority.check()
            piece = view[start:start + _WRITE_BYTES]
            self._hasher.update(piece)
            if self._target is not None:
                while piece:
                    written = self._target.write(piece)
                    piece = piece[len(piece) if written is None else written:]
                self._unflushed += min(_WRITE_BYTES, total - start)
                if self._flush_every is not None and self._unflushed >= self._flush_every:
                    self._target.flush()
                    self._unflushed = 0
        self.size += total
        return total

    def flush(self) -> None:
        pass  # the target is flushed when it is closed

    def entry(self) -> FileEntry:
        return FileEntry(size=self.size, checksum=self._hasher.hexdigest())


def entry_of_bytes(data: bytes) -> FileEntry:
    """``data``'s entry (size and checksum), as a manifest lists a file of those bytes."""
    sink = HashingSink(None)
    sink.write(data)
    return sink.entry()


def direct_writer(job: UploadJob, local_tier: object) -> DirectWriter | None:
    """The writer of a deferred ``job`` that can serialize straight into storage; None
    for any other job, and where the worker keeps a local copy of what it uploads (a
    local tier: the snapshot is then serialized into a local directory, uploaded, kept)."""
    writer = job.write
    if writer is None or local_tier is not None or not callable(
            getattr(writer, "write_file", None)):
        return None
    return writer  # type: ignore[return-value]


def write_direct(job: UploadJob, writer: DirectWriter, answer: object,
                 destination: StorageLocation, rank: int, started: float, *,
                 options: StorageOptions,
                 escalate_after_s: float = ESCALATE_AFTER_S,
                 keep: WriterKeeper | None = None, small_limit: int = 0) -> UploadedMessage:
    """Serialize every file of ``writer`` into ``destination``, hashing as it goes; the
    paths the controller's ``answer`` names as another rank's are hashed, not written.
    After ``escalate_after_s`` the calling thread takes the train loop's priority
    (:class:`AdaptivePriority`), until this returns. ``keep.hold(index, writer, entries)``
    is offered the writer once every file is written (a kept rank's memory copy,
    :mod:`.memory_copy`); it is closed here unless ``keep`` takes it (True). A kept
    writer's smallest files, up to ``small_limit`` bytes, go in the message too
    (:func:`small_files`)."""
    priority = AdaptivePriority(escalate_after_s)
    kept = False
    try:
        message = _write_all(job, writer, answer, destination, rank, started, options,
                             priority)
        if keep is not None:
            kept = keep.hold(job.index, writer, {**message.entries, **message.duplicates})
        if kept and small_limit > 0:
            try:
                small = small_files(writer, message.entries, small_limit)
            except Exception as exc:  # the upload itself succeeded: storage serves them
                logger.info("Report %d: no small files for the driver: %r", job.index, exc)
                small = {}
            message = dataclasses.replace(message, small_files=small)
        return message
    finally:
        priority.restore()
        if not kept:
            writer.close()


def small_files(writer: DirectWriter, entries: dict[str, FileEntry],
                limit: int) -> dict[str, bytes]:
    """The bytes of the smallest of ``entries`` (files ``writer`` wrote), up to ``limit``
    in all, each serialized again; one whose bytes do not hash to its entry is left out."""
    kept: dict[str, bytes] = {}
    total = 0
    for rel, entry in sorted(entries.items(), key=lambda item: (item[1].size, item[0])):
        cost = driver_copy_cost(rel, entry.size)
        if total + cost > limit:
            break
        buffer = io.BytesIO()
        sink = HashingSink(buffer)
        writer.write_file(rel, sink)  # type: ignore[arg-type]
        if sink.entry() == entry:
            kept[rel] = buffer.getvalue()
            total += cost
    return kept


def _write_all(job: UploadJob, writer: DirectWriter, answer: object,
               destination: StorageLocation, rank: int, started: float,
               options: StorageOptions, priority: AdaptivePriority) -> UploadedMessage:
    retry = options.retry
    skipped = set(answer.duplicates) if isinstance(answer, ProceedMessage) else set()
    names = writer.names()
    if set(names) != set(job.files):
        raise ReportError(
            f"The deferred checkpoint of report {job.index} has the files {sorted(names)}, "
            f"not the ones it declared: {sorted(job.files)}.")
    root = local_os_path(destination)
    fs = destination.filesystem
    window = (options.transfer or tuning.current()).memory_bytes
    parents = sorted({rel.rpartition("/")[0] for rel in names if rel not in skipped})
    if root is not None:
        for parent in parents:
            os.makedirs(os.path.join(root, *parent.split("/")) if parent else root,
                        exist_ok=True)
    elif needs_directories(fs):
        for parent in parents:
            path = destination.join(parent).path if parent else destination.path
            storage_call(functools.partial(fs.create_dir, path, recursive=True),
                         destination, retry, "create directory under")

    @contextmanager
    def sink_for(rel: str) -> Iterator[HashingSink]:
        if rel in skipped:
            yield HashingSink(None, priority=priority)
        elif root is not None:
            with create_or_truncate(os.path.join(root, *rel.split("/"))) as raw:
                yield HashingSink(raw, priority=priority)
        else:
            with fs.open_output_stream(destination.join(rel).path) as stream:
                yield HashingSink(stream, flush_every=window, priority=priority)

    def attempt(rel: str) -> FileEntry:
        with sink_for(rel) as sink:
            writer.write_file(rel, sink)  # type: ignore[arg-type]
        return sink.entry()

    written: dict[str, FileEntry] = {}
    duplicates: dict[str, FileEntry] = {}
    for rel in names:
        entry = with_retry(functools.partial(attempt, rel), retry,
                           f"write {rel!r} of report {job.index} to {destination.display()}")
        (duplicates if rel in skipped else written)[rel] = entry
    priority.check()
    sync_written(destination, written, options)
    size = sum(entry.size for entry in written.values())
    seconds = time.perf_counter() - started
    logger.debug("Report %d: %d bytes serialized into %s in %.3fs", job.index, size,
                 destination.display(), seconds)
    return UploadedMessage(rank, job.index, dict(sorted(written.items())), None, size,
                           seconds, duplicates=duplicates)
