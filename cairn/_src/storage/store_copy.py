"""Copy a directory from one store to another, checksummed as it streams.

What a SYNC or ASYNC ``report()`` does with a checkpoint that is already on a store (S3,
a registered scheme, any filesystem other than the local disk): each file is read by the
bounded, typed reader (:mod:`.reader`: regular files only, at most the size it had when
opened plus one byte) and written straight to the destination, hashed on the way, so no
local copy is made and the bytes are read once. A file that hits a transient error is
copied again as a whole, per the :class:`RetryPolicy`; the first permanent failure cancels
the files still running and is raised.

Thread-safety: may be called from several threads at once.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping

from cairn._src.errors import StorageError
from cairn._src.storage import tuning
from cairn._src.storage.checksum import (
    BUFFERS,
    LOCAL_CHUNK_BYTES,
    FileEntry,
    new_hasher,
    stream_copy,
)
from cairn._src.storage.fileio import create_parents
from cairn._src.storage.local_files import create_or_truncate
from cairn._src.storage.location import StorageLocation
from cairn._src.storage.parallel import (
    Cancelled,
    check_workers,
    raise_first,
    run_parallel,
    with_retry,
)
from cairn._src.storage.paths import check_relative_path
from cairn._src.storage.reader import local_os_path, open_regular_file
from cairn._src.storage.retry import DEFAULT_RETRY, RetryPolicy
from cairn._src.storage.transfer_plan import plan
from cairn._src.storage.tuning import TransferConfig
from cairn._src.text import plural

logger = logging.getLogger(__name__)

__all__ = ["copy_directory"]


def copy_directory(
    src: StorageLocation,
    dest: StorageLocation,
    *,
    files: Mapping[str, int],
    retry: RetryPolicy = DEFAULT_RETRY,
    max_workers: int | None = None,
    transfer: TransferConfig | None = None,
) -> dict[str, FileEntry]:
    """Copy ``files`` (relative path -> listed size) of the directory ``src`` to ``dest``;
    return ``relpath -> FileEntry`` (the size and checksum of the bytes written).

    Parent directories are created on file systems. A file whose size changes while it is
    copied raises :class:`StorageError` naming it (finish writing a checkpoint before
    reporting it). A failed copy may leave files at ``dest``: they are not committed until
    a manifest names them. ``max_workers`` files are copied at a time (default: the
    concurrency of ``transfer``, the process default when None, on a remote side; the
    cores when both sides are local disks).
    """
    if max_workers is not None:
        check_workers(max_workers)
    transfer = transfer or tuning.current()
    names = {check_relative_path(rel, argument="files"): int(size)
             for rel, size in files.items()}
    create_parents(dest, names, retry)
    local_dest = local_os_path(dest)
    # The remote side sets the pace: its part size and concurrency.
    remote = src if local_os_path(src) is None else dest
    chunk, workers = plan(remote.filesystem, max_workers, list(names.values()), transfer)
    window = None
    if local_dest is None:
        tuning.ensure_io_threads(transfer)
        in_parallel = max(1, min(workers, len(names)))
        share = transfer.memory_bytes // in_parallel
        chunk = min(chunk, max(LOCAL_CHUNK_BYTES, share // 2))
        window = max(chunk, share - chunk)

    def task_for(rel: str) -> Callable[[Cancelled], FileEntry]:
        source, target = src.join(rel), dest.join(rel)
        what = f"copy {source.display()} to {target.display()}"
        target_os = None if local_dest is None else os.path.join(local_dest, *rel.split("/"))

        def attempt(cancelled: Cancelled) -> FileEntry:
            hasher = new_hasher()
            with (
                open_regular_file(src, rel, expected_size=None) as opened,
                BUFFERS.borrow(chunk) as buffer,
                dest.filesystem.open_output_stream(target.path) if target_os is None
                else create_or_truncate(target_os) as sink,
            ):
                size = stream_copy(opened.stream, sink, buffer, hasher=hasher,
                                   progress=lambda _: None, cancelled=cancelled,
                                   raw_sink=target_os is not None, limit=opened.limit,
                                   flush_every=window)
            if opened.size is not None and size != opened.size:
                raise StorageError(
                    f"File {rel!r} of {src.display()} changed while Cairn copied it "
                    f"({opened.size} bytes when opened, {size} read); finish writing a "
                    "checkpoint before reporting it."
                )
            return FileEntry(size=size, checksum=hasher.hexdigest())

        def task(cancelled: Cancelled) -> FileEntry:
            return with_retry(lambda: attempt(cancelled), retry, what)

        return task

    started = time.perf_counter()
    # Largest first balances the threads.
    ordered = sorted(names, key=lambda rel: -names[rel])
    results, errors = run_parallel({rel: task_for(rel) for rel in ordered}, workers,
                                   collect_all=False)
    raise_first(errors)
    logger.debug("Copied %s (%d bytes) from %s to %s in %.3fs", plural(len(results), "file"),
                 sum(entry.size for entry in results.values()), src.display(),
                 dest.display(), time.perf_counter() - started)
    return {rel: results[rel] for rel in sorted(results)}


