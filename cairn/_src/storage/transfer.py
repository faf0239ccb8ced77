"""Parallel, checksummed directory transfers between a local disk and any storage.

Each file is one task on a thread pool; the checksum is computed on the bytes as they
stream (read a chunk into a reused buffer, hash it, write it), so verification costs no
second pass over the data. A file that hits a transient error is transferred again as a
whole, per the :class:`RetryPolicy`; the first permanent failure cancels the files still
running and is raised, with the backend's exception chained.

Thread-safety: every function here may be called from several threads at once; the
``progress`` callback is never called concurrently with itself.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import time
from collections.abc import Callable, Container, Iterable, Mapping
from typing import TypeVar

from cairn._src.errors import (
    CheckpointDamagedError,
    ChecksumMismatchError,
    MissingCheckpointFileError,
    NotARegularFileError,
    StorageError,
    UnsafePathError,
)
from cairn._src.storage import batch, tuning
from cairn._src.storage.checksum import (
    BUFFERS,
    CHECKSUM_ALGORITHM,
    LOCAL_CHUNK_BYTES,
    FileEntry,
    Progress,
    new_hasher,
    stream_copy,
)
from cairn._src.storage.fileio import (
    TEMPORARY_MARK,
    create_parents,
    list_files,
)
from cairn._src.storage.local_files import check_nothing_in_the_way as _check_nothing_in_the_way
from cairn._src.storage.local_files import create_new as _create_new
from cairn._src.storage.local_files import create_or_truncate as _create_or_truncate
from cairn._src.storage.local_files import move_into as _move_into
from cairn._src.storage.local_files import remove_local as _remove_local
from cairn._src.storage.local_files import temporary_sibling as _temporary_sibling
from cairn._src.storage.location import StorageLocation
from cairn._src.storage.parallel import (
    Cancelled,
    check_workers,
    counting,
    raise_first,
    run_parallel,
    with_retry,
)
from cairn._src.storage.paths import check_relative_path, list_local_files
from cairn._src.storage.ranged import Fetcher
from cairn._src.storage.reader import local_os_path, open_regular_file
from cairn._src.storage.retry import DEFAULT_RETRY, RetryPolicy
from cairn._src.storage.transfer_plan import FirstTry as _FirstTry
from cairn._src.storage.transfer_plan import copy_bytes as _copy_bytes
from cairn._src.storage.transfer_plan import plan as _plan
from cairn._src.storage.transfer_plan import ranged_fetcher as _fetcher
from cairn._src.storage.transfer_plan import reading as _reading
from cairn._src.storage.tuning import TransferConfig
from cairn._src.text import plural

logger = logging.getLogger(__name__)

__all__ = [
    "CHECKSUM_ALGORITHM",
    "FileEntry",
    "compute_entries",
    "download_directory",
    "upload_directory",
    "verify_directory",
]

T = TypeVar("T", bound="FileEntry | int | None")

# How many bad files a verification error names before it summarizes.
_MAX_NAMED_FAILURES = 5


def upload_directory(
    local_dir: str,
    dest: StorageLocation,
    *,
    files: Iterable[str] | None = None,
    exclude: Container[str] = (),
    retry: RetryPolicy = DEFAULT_RETRY,
    max_workers: int | None = None,
    progress: Callable[[int], None] | None = None,
    background: bool = False,
    transfer: TransferConfig | None = None,
) -> dict[str, FileEntry]:
    """Copy the files of ``local_dir`` to ``dest``; return ``relpath -> FileEntry``.

    ``files`` limits the copy to those relative paths (default: every file, see
    :func:`list_local_files` for what is refused); names in ``exclude`` are skipped.
    Parent directories are created on file systems. ``progress(delta_bytes)`` is called as
    bytes are written; a file that is retried takes its bytes back with a negative delta.
    A failed upload may leave files at ``dest``: they are not committed until a manifest
    names them. ``background``: the process's other threads keep running Python meanwhile
    (an ASYNC upload), so a copy to local storage runs on one thread (unless
    ``max_workers`` is given) in 16 MiB chunks, taking the GIL less often and never from
    two copy threads in turn (see :func:`_plan`).
    To remote storage (``transfer``: the process default, see :mod:`.tuning`) the files
    copied at once share ``part_size * max_concurrency`` bytes: each is written through a
    buffer of up to half its share, at most ``part_size``, and waits for its background
    parts whenever the rest of its share is on its way. ``max_workers`` (default: the cores
    locally, one locally in the background, ``max_concurrency`` remotely, never more) files
    are copied at a time.
    """
    if max_workers is not None:
        check_workers(max_workers)
    transfer = transfer or tuning.current()
    local_dir = os.fspath(local_dir)
    known: dict[str, int] | None = None  # relpath -> listed size, when known
    if files is None:
        listing = dict(list_local_files(local_dir))
        names = sorted(listing, key=lambda rel: -listing[rel])  # Largest first balances.
        known = listing
    else:
        names = [check_relative_path(rel, argument="files") for rel in files]
        if isinstance(files, Mapping):
            known = {check_relative_path(rel, argument="files"): int(size)
                     for rel, size in files.items()}
    names = [rel for rel in names if rel not in exclude]
    shared = Progress(progress)
    create_parents(dest, names, retry)
    fs = dest.filesystem
    # On a local destination files are written with plain OS calls: pyarrow's output
    # stream costs about three times as much per file, which dominates for small files.
    local_dest = local_os_path(dest)
    done, rest = _small_first(
        None if local_dest is None else batch.Job(
            "upload", local_dir, local_dest, max_workers=max_workers, background=background,
            progress=shared),
        {rel: None if known is None else known[rel] for rel in names})
    names = [rel for rel in names if rel in rest]
    chunk, workers = _plan(fs, max_workers, None if known is None else [
        known[rel] for rel in names], transfer, background=background)
    window = None
    if local_dest is None:
        tuning.ensure_io_threads(transfer)
        # Each file copied at once gets an equal share of part_size * max_concurrency,
        # for its copy buffer and the bytes it lets pyarrow hold before it waits.
        in_parallel = max(1, min(workers, len(names)))
        share = transfer.memory_bytes // in_parallel
        chunk = min(chunk, max(LOCAL_CHUNK_BYTES, share // 2))
        window = max(chunk, share - chunk)

    def task_for(rel: str) -> Callable[[Cancelled], FileEntry]:
        source_path = os.path.join(local_dir, *rel.split("/"))
        target = dest.join(rel)
        what = f"upload {source_path!r} to {target.display()}"
        target_os = None if local_dest is None else os.path.join(local_dest, *rel.split("/"))

        def attempt(cancelled: Cancelled) -> FileEntry:
            report, undo = counting(shared)
            hasher = new_hasher()
            try:
                with (
                    open(source_path, "rb", buffering=0) as source,
                    BUFFERS.borrow(chunk) as buffer,
                    fs.open_output_stream(target.path) if target_os is None
                    else _create_or_truncate(target_os) as sink,
                ):
                    size = stream_copy(
                        source, sink, buffer, hasher=hasher, progress=report,
                        cancelled=cancelled, raw_sink=target_os is not None,
                        flush_every=window,
                    )
            except BaseException:
                undo()
                raise
            return FileEntry(size=size, checksum=hasher.hexdigest())

        def task(cancelled: Cancelled) -> FileEntry:
            return with_retry(lambda: attempt(cancelled), retry, what)

        return task

    started = time.perf_counter()
    results, errors = run_parallel(
        {rel: task_for(rel) for rel in names}, workers, collect_all=False
    )
    raise_first(errors)
    results.update(done)
    total = sum(entry.size for entry in results.values())
    elapsed = time.perf_counter() - started
    logger.debug(
        "Uploaded %s (%d bytes) to %s in %.3fs", plural(len(results), "file"), total,
        dest.display(), elapsed,
    )
    return {rel: results[rel] for rel in sorted(results)}


def _small_first(job: batch.Job | None, files: Mapping[str, T]) -> tuple[
        dict[str, FileEntry], dict[str, T]]:
    """The small-file path (:mod:`.batch`), the one place it is called from: every
    transfer offers it ``files`` (checked relpath -> expected entry, size, or None when
    not known) first, a ``job`` where the files are on the local disk (else None).

    It takes the files of known size up to :data:`.batch.SMALL_FILE_BYTES` (every file,
    for a ``sizes`` job, which reads none), a directory at a time, and finishes only the
    expected case. Returns (the entries it computed, see :func:`.batch.run`; the files it
    did not finish, for the per-file path, which checks them again, retries them and
    reports them in its own words).
    """
    if job is None or not files or not batch.available():
        return {}, dict(files)
    small = {rel: want for rel, want in files.items() if job.operation == "sizes"
             or want is None or _size_of(want) <= batch.SMALL_FILE_BYTES}
    if not small:
        return {}, dict(files)
    done, left = batch.run(job, small)
    return done, {rel: want for rel, want in files.items() if rel not in small or rel in left}


def download_directory(
    src: StorageLocation,
    local_dir: str,
    *,
    files: Mapping[str, FileEntry] | None = None,
    verify: bool = True,
    retry: RetryPolicy = DEFAULT_RETRY,
    max_workers: int | None = None,
    progress: Callable[[int], None] | None = None,
    transfer: TransferConfig | None = None,
) -> None:
    """Copy files of ``src`` into ``local_dir`` (created when missing).

    ``files`` (relpath -> expected entry, e.g. from a manifest) names what to copy; by
    default every file under ``src``, whose listed sizes are then all that can be
    checked. Every file is read by the bounded, typed reader (:mod:`.reader`): regular
    files only, no link followed (except, without ``files``, links inside a local
    directory that :func:`list_local_files` accepts), at most the expected size plus one
    byte. A size that differs raises :class:`ChecksumMismatchError` naming the file; with
    ``verify`` the checksum is compared too while the file streams. Every file is written
    into a staging directory inside ``local_dir`` (``.cairn-tmp-restore-`` and 16 hex
    digits, mode 0700), which is moved into place once every file is complete and
    verified: an entry that ``local_dir`` lacks by one rename (a whole directory at once),
    a file over the one there, a directory into the one there. So no half-written file
    ever has its final name, a failed download adds nothing to ``local_dir`` (the
    staging directory is removed), and the small files need no rename each. Unsafe
    relative paths (``..``, absolute) raise :class:`UnsafePathError` before
    anything is written. From remote storage a file of at least
    ``transfer.multipart_threshold`` bytes is read as parallel ranged requests, hashed and
    written in order (:mod:`.ranged`); ``transfer`` defaults to the process's
    (:mod:`.tuning`).
    """
    if max_workers is not None:
        check_workers(max_workers)
    transfer = transfer or tuning.current()
    local_dir = os.fspath(local_dir)
    expected: dict[str, FileEntry | int]
    follow_links = False
    if files is not None:
        expected = dict(files)
    elif local_os_path(src) is not None:
        # A user's local directory (not committed): list it as an upload would.
        expected = dict(list_local_files(str(local_os_path(src))))
        follow_links = True
    else:
        expected = dict(list_files(src, retry))
    checked = {check_relative_path(rel, argument="files"): rel for rel in expected}
    parents = {parent for parent in {rel.rpartition("/")[0] for rel in checked} if parent}
    os.makedirs(local_dir, exist_ok=True)
    _check_nothing_in_the_way(local_dir, parents, checked)
    staging = os.path.join(local_dir, f"{TEMPORARY_MARK}restore-{secrets.token_hex(8)}")
    os.mkdir(staging, 0o700)
    try:
        for parent in sorted(parents):
            os.makedirs(os.path.join(staging, *parent.split("/")), exist_ok=True)
        _download_into(src, staging, local_dir, expected, checked, follow_links=follow_links,
                       verify=verify, retry=retry, max_workers=max_workers,
                       shared=Progress(progress), transfer=transfer)
        _move_into(staging, local_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _download_into(src: StorageLocation, staging: str, local_dir: str,
                   expected: Mapping[str, FileEntry | int], checked: dict[str, str], *,
                   follow_links: bool, verify: bool, retry: RetryPolicy,
                   max_workers: int | None, shared: Progress,
                   transfer: TransferConfig) -> None:
    """The files of :func:`download_directory` (``checked``: checked relpath -> the
    name in ``expected``) into ``staging``, whose directories exist; errors name the
    file's place in ``local_dir``; ``shared`` counts the bytes."""
    src_root = local_os_path(src)
    _, rest = _small_first(
        None if src_root is None or follow_links else batch.Job(
            "download", src_root, staging, verify=verify, max_workers=max_workers,
            progress=shared),
        {rel: expected[original] for rel, original in checked.items()})
    checked = {rel: original for rel, original in checked.items() if rel in rest}
    sizes = [_size_of(expected[original]) for original in checked.values()]
    chunk, workers = _plan(src.filesystem, max_workers, sizes, transfer)
    fetcher = _fetcher(src, sizes, transfer, retry)

    def task_for(rel: str, want: FileEntry | int) -> Callable[[Cancelled], None]:
        final = os.path.join(staging, *rel.split("/"))
        what = f"download {src.join(rel).display()} to {os.path.join(local_dir, *rel.split('/'))!r}"
        want_size = want.size if isinstance(want, FileEntry) else want
        ranged = _FirstTry(fetcher)

        def attempt(cancelled: Cancelled) -> None:
            report, undo = counting(shared)
            hasher = new_hasher() if verify and isinstance(want, FileEntry) else None
            temporary = _temporary_sibling(final)
            parts = ranged.take()
            try:
                with (
                    _reading(src, rel, want_size, parts, follow_links) as opened,
                    BUFFERS.borrow(_copy_bytes(chunk, parts, want_size)) as buffer,
                    _create_new(temporary) as sink,
                ):
                    size = stream_copy(
                        opened.stream, sink, buffer, hasher=hasher, progress=report,
                        cancelled=cancelled, raw_sink=True, limit=opened.limit,
                    )
                _check(src, rel, want, size, hasher)
                os.replace(temporary, final)
            except BaseException:
                undo()
                _remove_local(temporary)
                raise

        def task(cancelled: Cancelled) -> None:
            with_retry(lambda: attempt(cancelled), retry, what)

        return task

    started = time.perf_counter()
    tasks = {rel: task_for(rel, expected[original]) for rel, original in checked.items()}
    try:
        _, errors = run_parallel(tasks, workers, collect_all=False)
    finally:
        if fetcher is not None:
            fetcher.close()
    raise_first(errors)
    logger.debug(
        "Downloaded %s from %s to %s in %.3fs", plural(len(tasks), "file"), src.display(),
        local_dir, time.perf_counter() - started,
    )


def _size_of(want: FileEntry | int) -> int:
    return want.size if isinstance(want, FileEntry) else int(want)


def _check(
    directory: StorageLocation, rel: str, want: FileEntry | int, size: int, hasher: object
) -> None:
    want_size = want.size if isinstance(want, FileEntry) else want
    if size != want_size:
        raise ChecksumMismatchError(
            f"File {rel!r} of {directory.display()} is corrupt: expected {want_size} bytes, "
            f"read {'more' if size > want_size else size}. The file was changed or "
            "truncated after it was committed."
        )
    if isinstance(want, FileEntry) and hasher is not None:
        actual = hasher.hexdigest()  # type: ignore[attr-defined]
        if actual != want.checksum:
            raise ChecksumMismatchError(
                f"File {rel!r} of {directory.display()} is corrupt: expected "
                f"{CHECKSUM_ALGORITHM} checksum {want.checksum}, computed {actual}. The file "
                "was changed after it was committed."
            )


def _read_and_hash(
    loc: StorageLocation, rel: str, retry: RetryPolicy, want: FileEntry | None,
    follow_links: bool = False, fetcher: Fetcher | None = None,
    transfer: TransferConfig | None = None,
) -> Callable[[Cancelled], FileEntry]:
    source = loc.join(rel)
    what = f"read {source.display()}"

    want_size = None if want is None else want.size
    chunk = _plan(loc.filesystem, 1, config=transfer)[0]
    ranged = _FirstTry(fetcher)

    def attempt(cancelled: Cancelled) -> FileEntry:
        hasher = new_hasher()
        parts = ranged.take()
        with (
            _reading(loc, rel, want_size, parts, follow_links) as opened,
            BUFFERS.borrow(_copy_bytes(chunk, parts, want_size)) as buffer,
        ):
            size = stream_copy(
                opened.stream, None, buffer, hasher=hasher, progress=lambda _: None,
                cancelled=cancelled, limit=opened.limit,
            )
        if want is not None:
            _check(loc, rel, want, size, hasher)
        elif opened.size is not None and size != opened.size:
            raise StorageError(
                f"File {rel!r} of {loc.display()} changed while Cairn read it ({opened.size} "
                "bytes when opened); finish writing a checkpoint before reporting it."
            )
        return FileEntry(size=size, checksum=hasher.hexdigest())

    def task(cancelled: Cancelled) -> FileEntry:
        return with_retry(lambda: attempt(cancelled), retry, what)

    return task


def compute_entries(
    loc: StorageLocation,
    files: Iterable[str],
    *,
    retry: RetryPolicy = DEFAULT_RETRY,
    max_workers: int | None = None,
    follow_links: bool = False,
) -> dict[str, FileEntry]:
    """Read ``files`` (relative to ``loc``) from storage and return their entries.

    For checkpoints that are already on storage (registered by reference), read in place
    by the bounded, typed reader: a symbolic link anywhere in a file's path, or a file
    that is not a regular one, raises :class:`UnsafePathError` naming it, since
    restoring it later would read the link's target, outside the checkpoint. (SYNC
    uploads copy what a link inside the directory points to, and refuse links out of
    it; a reference is never copied, so it may hold no link at all.) ``follow_links`` is
    for a user's local directory about to be uploaded, whose links
    :func:`list_local_files` already checked: they are then followed.
    """
    if max_workers is not None:
        check_workers(max_workers)
    names = sorted({check_relative_path(rel, argument="files") for rel in files})
    root = local_os_path(loc)
    done, rest = _small_first(
        None if root is None else batch.Job("hash", root, follow_links=follow_links,
                                            max_workers=max_workers),
        dict.fromkeys(names))
    tasks = {rel: _read_and_hash(loc, rel, retry, None, follow_links) for rel in rest}
    results, errors = run_parallel(
        tasks, _plan(loc.filesystem, max_workers)[1], collect_all=False
    )
    results.update(done)
    for error in errors.values():
        if isinstance(error, NotARegularFileError):
            raise UnsafePathError(
                f"The checkpoint at {loc.display()} cannot be committed: {error} Copy the "
                "data into the directory instead of linking to it: a checkpoint registered "
                "by reference is read in place and may contain regular files only."
            ) from error
    raise_first(errors)
    return {rel: results[rel] for rel in names}


# How many listings of a checkpoint on a remote store must agree before a file it lacks
# (or holds at another size) is damage (at least; RetryPolicy.max_attempts when more).
MIN_LISTINGS = 3


def check_directory_sizes(
    loc: StorageLocation, files: Mapping[str, FileEntry], *,
    retry: RetryPolicy = DEFAULT_RETRY,
) -> None:
    """The cheap check of a committed checkpoint: every file of ``files`` is a regular file
    of the recorded size. No data is read, so checksums are not checked (readers verify
    them as they download).

    On local storage each file is checked with one ``lstat`` below directories opened
    without following links, and any that differs once more through the bounded, typed
    reader (links, FIFOs, devices and directories refused, nothing read); elsewhere one
    recursive listing is compared with the manifest, listed again with backoff while it
differs (:data:`MIN_LISTINGS`). Raises the
    :class:`CheckpointDamagedError` of the first damaged file in path order; an outage
    propagates as itself.
    """
    root = local_os_path(loc)
    if root is not None:
        # One stat a file, a directory at a time; what differs is checked again below.
        originals = {check_relative_path(rel, argument="files"): rel for rel in files}
        _, rest = _small_first(batch.Job("sizes", root), {
            rel: files[original].size for rel, original in originals.items()})
        for rel in sorted(originals[rel] for rel in rest):
            what = f"check {loc.join(rel).display()}"

            def open_only(rel: str = rel) -> None:
                with open_regular_file(loc, check_relative_path(rel, argument="files"),
                                       expected_size=files[rel].size):
                    pass

            with_retry(open_only, retry, what)
        return
    # One listing is one answer: an eventually consistent store, or a client that turns a
    # timeout into "nothing", can leave out a file it holds. Damage is what every one of a
    # few listings, with backoff between them, shows.
    damage = _listing_damage(loc, files, list_files(loc, retry))
    for relisting in range(max(MIN_LISTINGS, retry.max_attempts) - 1):
        if damage is None:
            return
        time.sleep(retry.backoff(relisting))
        damage = _listing_damage(loc, files, list_files(loc, retry))
    if damage is not None:
        raise damage


def _listing_damage(loc: StorageLocation, files: Mapping[str, FileEntry],
                    listed: Mapping[str, int]) -> CheckpointDamagedError | None:
    """The damage a listing of ``loc`` shows against ``files``: its first file in path
    order that is not listed with its recorded size; None when there is none."""
    for rel in sorted(files):
        want = files[rel].size
        if rel not in listed:
            # Listed as a directory, or not at all: either way not the committed file.
            return MissingCheckpointFileError(
                f"File {rel!r} of {loc.display()} does not exist as a file: it was deleted "
                "or replaced after the checkpoint was committed.")
        if listed[rel] != want:
            return ChecksumMismatchError(
                f"File {rel!r} of {loc.display()} is corrupt: expected {want} bytes, storage "
                f"holds {listed[rel]}. The file was changed or truncated after it was "
                "committed.")
    return None


def verify_directory(
    loc: StorageLocation,
    files: Mapping[str, FileEntry],
    *,
    retry: RetryPolicy = DEFAULT_RETRY,
    max_workers: int | None = None,
    transfer: TransferConfig | None = None,
) -> None:
    """Check that every file of ``files`` under ``loc`` has the recorded size and checksum.

    Every file goes through the bounded, typed reader (:mod:`.reader`): it is read only
    if it is a regular file of the recorded size, and never past that size. Reads
    everything, then raises for the damaged files in path order, with the class of the
    first one: :class:`MissingCheckpointFileError` (missing), :class:`NotARegularFileError`
    (a link, directory, FIFO or device) or :class:`ChecksumMismatchError`, all
    :class:`CheckpointDamagedError`; the message names up to five. Without damage, the
    first other error (an outage) is raised as it is. Large remote files are read as
    parallel ranged requests, as :func:`download_directory` does.
    """
    if max_workers is not None:
        check_workers(max_workers)
    checked = {check_relative_path(rel, argument="files"): entry for rel, entry in files.items()}
    root = local_os_path(loc)
    _, checked = _small_first(
        None if root is None else batch.Job("hash", root, max_workers=max_workers), checked)
    sizes = [entry.size for entry in checked.values()]
    threads = _plan(loc.filesystem, max_workers, sizes, transfer)[1]
    fetcher = _fetcher(loc, sizes, transfer, retry)
    tasks = {rel: _read_and_hash(loc, rel, retry, entry, fetcher=fetcher, transfer=transfer)
             for rel, entry in checked.items()}
    try:
        _, errors = run_parallel(tasks, threads, collect_all=True)
    finally:
        if fetcher is not None:
            fetcher.close()
    if not errors:
        return
    # An outage cannot make a file look damaged (a failed read raises, it returns no short
    # data): one damaged file makes the checkpoint damaged, whatever else failed.
    bad = sorted(rel for rel, exc in errors.items() if isinstance(exc, CheckpointDamagedError))
    if not bad:
        raise errors[min(errors)]
    first = errors[bad[0]]
    lines = [str(errors[rel]) for rel in bad[:_MAX_NAMED_FAILURES]]
    if len(bad) > _MAX_NAMED_FAILURES:
        lines.append(f"... and {len(bad) - _MAX_NAMED_FAILURES} more bad files")
    message = (f"{len(bad)} of {plural(len(files), 'file')} under {loc.display()} failed "
               "verification: ")
    raise type(first)(message + "; ".join(lines)) from first


def verify_committed(loc: StorageLocation, files: Mapping[str, FileEntry], *,
                     retry: RetryPolicy = DEFAULT_RETRY,
                     transfer: TransferConfig | None = None) -> None:
    """:func:`verify_directory` of a committed checkpoint. A file read as missing is one
    answer: the listings of :func:`check_directory_sizes` decide (damage when they agree
    that it is gone); listed after all, it is read again, and a store whose reads keep
    missing what its listings show is in an outage (:class:`StorageError`), not damaged."""
    try:
        verify_directory(loc, files, retry=retry, transfer=transfer)
        return
    except MissingCheckpointFileError:
        check_directory_sizes(loc, files, retry=retry)
    try:
        verify_directory(loc, files, retry=retry, transfer=transfer)
    except MissingCheckpointFileError as exc:
        raise StorageError(f"{loc.display()}: storage lists every file of the checkpoint, "
                           f"but reads answer that one is missing ({exc}); not resuming "
                           "until it answers consistently") from None
