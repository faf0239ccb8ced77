"""Checksums of checkpoint files, computed while the bytes stream through.

The algorithm is XXH3 with a 128-bit digest. Checkpoint checksums guard against storage
and transfer corruption (truncated uploads, bit rot, a wrong object served), not against
an attacker who can write to the bucket, so a cryptographic hash would only cost time:
XXH3 hashes at memory bandwidth (over 10 GB/s on one core), which keeps verification
within the copy's own cost, and 128 bits make an accidental collision among billions of
files negligible, where CRC32 or 64-bit hashes would not.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import xxhash

from cairn._src.errors import ConfigError

CHECKSUM_ALGORITHM = "xxh3_128"

# Read/write unit between local disks: the copy is CPU- and cache-bound there, and 1 MiB
# stays in the CPU caches between the read, the hash and the write. bench/transfer.py
# measured 1 MiB ahead of 2, 4 and 8 MiB by 5-15% (2 cores, page cache warm).
LOCAL_CHUNK_BYTES = 1 << 20
# The same for an upload in the background while the training loop runs Python (ASYNC):
# each chunk takes the GIL back three times (after the read, the hash and the write), and
# a thread waiting for it gets it only at the loop's switch interval (5 ms). 512 MiB in
# 1 MiB chunks took 4.7 s beside a busy loop (0.11 s beside an idle one), in 16 MiB
# chunks 0.45 s, the loop's steps the same in both.
BACKGROUND_CHUNK_BYTES = 16 << 20
# Buffers kept for reuse between transfers (a fresh buffer costs a page fault per 4 KiB).
_POOL_LIMIT_BYTES = 64 << 20

_ALGORITHMS: dict[str, Callable[[], Any]] = {"xxh3_128": xxhash.xxh3_128}
# The checksum algorithms this Cairn can verify.
ALGORITHMS = frozenset(_ALGORITHMS)


@dataclass(frozen=True)
class FileEntry:
    """A file of a checkpoint as the manifest records it: size in bytes, hex checksum."""

    size: int
    checksum: str


@dataclass(frozen=True)
class WrittenFile:
    """A file's entry as the process that wrote it computed it while writing, with the
    identity the file had when it was closed (``os.stat``'s ``st_mtime_ns`` and
    ``st_ino``): a reader that finds the file with the same size and identity may take the
    entry instead of reading the file again (see
    :func:`cairn._src.checkpoint.references.reference_entries`)."""

    entry: FileEntry
    mtime_ns: int
    inode: int


def new_hasher(algorithm: str = CHECKSUM_ALGORITHM) -> Any:
    """A streaming hasher (``update(bytes)``, ``hexdigest()``) for ``algorithm``."""
    try:
        return _ALGORITHMS[algorithm]()
    except KeyError:
        raise ConfigError(
            f"checksum algorithm {algorithm!r} is not supported; this Cairn computes "
            f"{', '.join(sorted(_ALGORITHMS))}."
        ) from None


class BufferPool:
    """Reusable chunk buffers, so that a transfer does not fault in fresh memory. Thread-safe."""

    def __init__(self, limit_bytes: int = _POOL_LIMIT_BYTES) -> None:
        self._limit = limit_bytes
        self._free: dict[int, list[memoryview]] = {}
        self._kept = 0
        self._lock = threading.Lock()

    def clear(self) -> None:
        """Drop the buffers kept for reuse (their memory goes back once unreferenced)."""
        with self._lock:
            self._free.clear()
            self._kept = 0

    @contextmanager
    def borrow(self, size: int) -> Iterator[memoryview]:
        """A buffer of ``size`` bytes for the ``with`` block; its content is undefined."""
        with self._lock:
            free = self._free.get(size)
            buffer = free.pop() if free else None
            if buffer is not None:
                self._kept -= size
        if buffer is None:
            buffer = memoryview(bytearray(size))
        try:
            yield buffer
        finally:
            with self._lock:
                if self._kept + size <= self._limit:
                    self._free.setdefault(size, []).append(buffer)
                    self._kept += size


BUFFERS = BufferPool()


class TransferCancelled(Exception):
    """Raised inside a transfer's worker when another file already failed."""


class Writable(Protocol):
    def write(self, data: Any) -> Any: ...

    def flush(self) -> Any: ...


class Progress:
    """Serializes calls to a user progress callback, so that it need not be thread-safe."""

    def __init__(self, callback: Callable[[int], None] | None) -> None:
        self._callback = callback
        self._lock = threading.Lock()

    def __call__(self, delta: int) -> None:
        if self._callback is not None and delta:
            with self._lock:
                self._callback(delta)


def stream_copy(
    source: Any,
    sink: Writable | None,
    buffer: memoryview,
    *,
    hasher: Any,
    progress: Callable[[int], None],
    cancelled: Callable[[], bool],
    raw_sink: bool = False,
    limit: int | None = None,
    flush_every: int | None = None,
) -> int:
    """Copy ``source`` to ``sink`` (or only read it when ``sink`` is None), hashing it.

    Reads into the reused ``buffer``: no allocation per chunk. ``raw_sink`` means the sink
    is an unbuffered OS file whose ``write`` may write less than asked. With ``limit``, at
    most that many bytes are read (a bounded read of a file that may be endless). Returns
    the bytes copied. Stops with :class:`TransferCancelled` when ``cancelled()`` turns
    true, so that one failed file ends the others of a transfer quickly. With
    ``flush_every``, the sink is flushed each time that many more bytes were written: a
    remote stream that uploads parts in the background holds at most about that much in
    memory (pyarrow's S3 stream buffers without bound when the network is slower than the
    source).
    """
    total = 0
    unflushed = 0
    whole = len(buffer)
    while True:
        if limit is not None and limit - total < whole:
            if total >= limit:
                return total
            count = source.readinto(buffer[: limit - total])
        else:
            count = source.readinto(buffer)
        if not count:
            return total
        view = buffer[:count]
        if hasher is not None:
            hasher.update(view)
        if sink is not None:
            if raw_sink:
                while view:
                    view = view[sink.write(view):]
            else:
                sink.write(view)
                unflushed += count
                if flush_every is not None and unflushed >= flush_every:
                    sink.flush()
                    unflushed = 0
        total += count
        progress(count)
        if cancelled():
            raise TransferCancelled("transfer cancelled after another file failed")
