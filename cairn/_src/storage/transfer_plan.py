"""How a directory transfer is planned: chunk size and threads for each side, and ranged
reads of large remote files (:mod:`.ranged`) for its first try.

Thread-safe: no shared state.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import pyarrow.fs as pafs

from cairn._src.storage import tuning
from cairn._src.storage.checksum import BACKGROUND_CHUNK_BYTES, LOCAL_CHUNK_BYTES
from cairn._src.storage.location import StorageLocation, local_root
from cairn._src.storage.ranged import Fetcher
from cairn._src.storage.reader import OpenedFile, open_regular_file
from cairn._src.storage.retry import RetryPolicy
from cairn._src.storage.tuning import TransferConfig

logger = logging.getLogger(__name__)


# Below this average file size a local copy is bound by the per-file work done in Python,
# which one thread does fastest: another thread only contends for the GIL and for the
# directory (20,000 files of 1 KiB on 2 cores: upload 40-46 us per file with 1 thread,
# 74-109 us with 2; verified restore 73-87 us against 150-165 us).
SMALL_FILE_BYTES = 256 << 10


# Remote file systems whose random-access files serve concurrent ranged reads (pyarrow's
# own). Python-backed ones (fsspec, custom object stores) read under one lock or whole.
RANGED_TYPES = frozenset({"s3", "gcs", "abfs", "hdfs"})


def plan(fs: pafs.FileSystem, max_workers: int | None, sizes: Iterable[int] | None = None,
          config: TransferConfig | None = None, *, background: bool = False) -> tuple[int, int]:
    """(chunk bytes, threads) for transfers with ``fs`` on the other side of local disk.

    Local to local, a copy is bound by CPU and memory bandwidth: more threads than cores
    only contend (bench/transfer.py: 8 threads were 20-60% slower than 2 on 2 cores), and
    for small files (``sizes``, when known, averaging under 256 KiB) one thread is
    fastest. ``background`` (an ASYNC upload beside a train loop that runs Python): 16 MiB
    chunks, on one thread unless ``max_workers`` says otherwise. Each chunk takes the GIL
    back three times, and a second copy thread makes the loop hand the GIL over twice as
    often and wait behind both (a pure-Python step's p90 during a 512 MiB copy on 2 cores:
    1.04x with one niced thread, 2.06x with two at normal priority, p99 1.56 ms against
    9.22 ms with two niced ones).
    Remote stores are bound by request latency: ``config``'s part size and concurrency
    (the process default when None) unless ``max_workers`` says otherwise.
    """
    if local_root(fs) is not None:
        threads = max(2, os.cpu_count() or 1)
        if max_workers is not None:
            threads = min(max_workers, threads)
        elif background:
            threads = 1
        known = list(sizes) if sizes is not None else []
        if known and sum(known) < SMALL_FILE_BYTES * len(known):
            threads = 1
        return (BACKGROUND_CHUNK_BYTES if background else LOCAL_CHUNK_BYTES), threads
    config = config or tuning.current()
    threads = config.max_concurrency
    if max_workers is not None:
        threads = min(max_workers, threads)
    return config.part_size, threads


def ranged_fetcher(loc: StorageLocation, sizes: Iterable[int], config: TransferConfig | None,
             retry: RetryPolicy) -> Fetcher | None:
    """A :class:`Fetcher` when some file of ``sizes`` at ``loc`` is read in ranged parts."""
    config = config or tuning.current()
    if loc.filesystem.type_name not in RANGED_TYPES:
        return None
    if not any(config.reads_in_parts(size) for size in sizes):
        return None
    return Fetcher(config, retry)


class FirstTry:
    """The fetcher for a file's first try only: a file whose ranged parts ran out of
    retries (a server that serves ranges slowly, so that parallel ones time out) is read
    again as one stream."""

    def __init__(self, fetcher: Fetcher | None) -> None:
        self._fetcher = fetcher

    def take(self) -> Fetcher | None:
        fetcher, self._fetcher = self._fetcher, None
        return fetcher


def copy_bytes(chunk: int, fetcher: Fetcher | None, size: int | None) -> int:
    """The copy buffer for a file of ``size``: ``chunk``, or 1 MiB for a ranged read,
    whose parts the fetcher already holds (and counts against its budget)."""
    if fetcher is not None and size is not None and fetcher.wants(size):
        return LOCAL_CHUNK_BYTES
    return chunk


@contextmanager
def reading(loc: StorageLocation, rel: str, want_size: int | None, fetcher: Fetcher | None,
             follow_links: bool = False) -> Iterator[OpenedFile]:
    """:func:`.reader.open_regular_file`, its stream read in ranged parts when ``fetcher`` takes a
    file of this size."""
    ranged = fetcher is not None and want_size is not None and fetcher.wants(want_size)
    with open_regular_file(loc, rel, expected_size=want_size, follow_links=follow_links,
                           random_access=ranged) as opened:
        if not ranged:
            yield opened
            return
        assert fetcher is not None and want_size is not None
        with fetcher.stream(opened.stream, want_size, f"read {loc.join(rel).display()}") as reader:
            yield dataclasses.replace(opened, stream=reader)
