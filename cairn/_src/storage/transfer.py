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
import threading
import time
import uuid
from collections.abc import Callable, Container, Iterable, Mapping
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import TypeVar

from cairn._src.errors import (
    CairnError,
    CheckpointNotFoundError,
    ChecksumMismatchError,
    ConfigError,
    StorageError,
)
from cairn._src.storage.checksum import (
    CHECKSUM_ALGORITHM,
    CHUNK_BYTES,
    FileEntry,
    Progress,
    TransferCancelled,
    new_hasher,
    stream_copy,
)
from cairn._src.storage.fileio import list_files, needs_directories, parent_path, storage_call
from cairn._src.storage.location import StorageLocation
from cairn._src.storage.paths import check_relative_path, list_local_files
from cairn._src.storage.retry import DEFAULT_RETRY, RetryPolicy, call_with_retry

logger = logging.getLogger(__name__)

__all__ = [
    "CHECKSUM_ALGORITHM",
    "FileEntry",
    "compute_entries",
    "download_directory",
    "upload_directory",
    "verify_directory",
]

R = TypeVar("R")
Cancelled = Callable[[], bool]

_buffers = threading.local()
# How many bad files a verification error names before it summarizes.
_MAX_NAMED_FAILURES = 5


def _buffer() -> memoryview:
    """This thread's chunk buffer, allocated once per thread rather than once per file."""
    buffer: memoryview | None = getattr(_buffers, "view", None)
    if buffer is None:
        buffer = memoryview(bytearray(CHUNK_BYTES))
        _buffers.view = buffer
    return buffer


def _convert(exc: BaseException, what: str) -> BaseException:
    """Cairn's error for a failure of ``what`` (a sentence fragment naming the file)."""
    if isinstance(exc, CairnError):
        return exc
    if isinstance(exc, FileNotFoundError):
        return CheckpointNotFoundError(f"Could not {what}: it does not exist ({exc}).")
    if isinstance(exc, PermissionError):
        return StorageError(
            f"Could not {what}: permission denied ({exc}). Check access rights and "
            "credentials."
        )
    if isinstance(exc, OSError):
        return StorageError(f"Could not {what}: {exc}")
    return exc


def _run_parallel(
    tasks: Mapping[str, Callable[[Cancelled], R]], max_workers: int, *, collect_all: bool
) -> tuple[dict[str, R], dict[str, BaseException]]:
    """Run ``tasks`` (name -> task) on a pool; return (results, errors).

    Without ``collect_all`` the first error cancels the rest and only it is returned.
    """
    results: dict[str, R] = {}
    errors: dict[str, BaseException] = {}
    stop = threading.Event()
    if len(tasks) <= 1 or max_workers <= 1:
        for name, task in tasks.items():
            try:
                results[name] = task(stop.is_set)
            except Exception as exc:
                errors[name] = exc
                if not collect_all:
                    break
        return results, errors
    workers = min(max_workers, len(tasks))
    with ThreadPoolExecutor(workers, thread_name_prefix="cairn-transfer") as pool:
        futures: dict[Future[R], str] = {
            pool.submit(task, stop.is_set): name for name, task in tasks.items()
        }
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_EXCEPTION)
            failed = [f for f in done if not f.cancelled() and f.exception() is not None]
            if failed and not collect_all:
                stop.set()
                for future in pending:
                    future.cancel()
                wait(pending)
                first = failed[0]
                errors[futures[first]] = first.exception()  # type: ignore[assignment]
                return results, errors
            for future in done:
                failure = future.exception()
                if failure is None:
                    results[futures[future]] = future.result()
                elif not isinstance(failure, TransferCancelled):
                    errors[futures[future]] = failure
    return results, errors


def _raise_first(errors: dict[str, BaseException]) -> None:
    real = {name: exc for name, exc in errors.items() if not isinstance(exc, TransferCancelled)}
    if real:
        raise next(iter(real.values()))


def _counting(progress: Progress) -> tuple[Callable[[int], None], Callable[[], None]]:
    """A progress function that remembers its total, and a function taking it back."""
    sent = [0]

    def report(delta: int) -> None:
        sent[0] += delta
        progress(delta)

    def undo() -> None:
        progress(-sent[0])
        sent[0] = 0

    return report, undo


def _check_workers(max_workers: int) -> None:
    if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
        raise ConfigError(f"max_workers={max_workers!r} must be an integer >= 1.")


def upload_directory(
    local_dir: str,
    dest: StorageLocation,
    *,
    files: Iterable[str] | None = None,
    exclude: Container[str] = (),
    retry: RetryPolicy = DEFAULT_RETRY,
    max_workers: int = 8,
    progress: Callable[[int], None] | None = None,
) -> dict[str, FileEntry]:
    """Copy the files of ``local_dir`` to ``dest``; return ``relpath -> FileEntry``.

    ``files`` limits the copy to those relative paths (default: every file, see
    :func:`list_local_files` for what is refused); names in ``exclude`` are skipped.
    Parent directories are created on file systems. ``progress(delta_bytes)`` is called as
    bytes are written; a file that is retried takes its bytes back with a negative delta.
    A failed upload may leave files at ``dest``: they are not committed until a manifest
    names them.
    """
    _check_workers(max_workers)
    local_dir = os.fspath(local_dir)
    if files is None:
        listing = list_local_files(local_dir)
        names = sorted(listing, key=lambda rel: -listing[rel])  # Largest first balances.
    else:
        names = [check_relative_path(rel, argument="files") for rel in files]
    names = [rel for rel in names if rel not in exclude]
    shared = Progress(progress)
    _create_parents(dest, names, retry)
    fs = dest.filesystem

    def task_for(rel: str) -> Callable[[Cancelled], FileEntry]:
        source_path = os.path.join(local_dir, *rel.split("/"))
        target = dest.join(rel)
        what = f"upload {source_path!r} to {target.display()}"

        def attempt(cancelled: Cancelled) -> FileEntry:
            report, undo = _counting(shared)
            hasher = new_hasher()
            try:
                with open(source_path, "rb", buffering=0) as source:
                    with fs.open_output_stream(target.path) as sink:
                        size = stream_copy(
                            source, sink, _buffer(), hasher=hasher, progress=report,
                            cancelled=cancelled,
                        )
            except BaseException:
                undo()
                raise
            return FileEntry(size=size, checksum=hasher.hexdigest())

        def task(cancelled: Cancelled) -> FileEntry:
            try:
                return call_with_retry(lambda: attempt(cancelled), retry, what=what)
            except (TransferCancelled, CairnError):
                raise
            except Exception as exc:
                raise _convert(exc, what) from exc

        return task

    started = time.perf_counter()
    results, errors = _run_parallel(
        {rel: task_for(rel) for rel in names}, max_workers, collect_all=False
    )
    _raise_first(errors)
    total = sum(entry.size for entry in results.values())
    elapsed = time.perf_counter() - started
    logger.debug(
        "Uploaded %d files (%d bytes) to %s in %.3fs", len(results), total, dest.display(),
        elapsed,
    )
    return {rel: results[rel] for rel in sorted(results)}


def _create_parents(dest: StorageLocation, names: Iterable[str], retry: RetryPolicy) -> None:
    if not needs_directories(dest.filesystem):
        return
    parents = {parent_path(dest.join(rel).path) for rel in names} | {dest.path}

    def create(path: str) -> Callable[[], None]:
        return lambda: dest.filesystem.create_dir(path, recursive=True)

    for path in sorted(parents):
        storage_call(create(path), dest, retry, f"create directory {path!r} under")


def download_directory(
    src: StorageLocation,
    local_dir: str,
    *,
    files: Mapping[str, FileEntry] | None = None,
    verify: bool = True,
    retry: RetryPolicy = DEFAULT_RETRY,
    max_workers: int = 8,
    progress: Callable[[int], None] | None = None,
) -> None:
    """Copy files of ``src`` into ``local_dir`` (created when missing).

    ``files`` (relpath -> expected entry, e.g. from a manifest) names what to copy; by
    default every file under ``src``, whose listed sizes are then all that can be
    checked. With ``verify``, each file's size and checksum are compared while it streams
    and a mismatch raises :class:`ChecksumMismatchError` naming the file, the expected and
    the actual values. Every file is written under a temporary name and renamed once
    complete (and verified), so no half-written file ever has its final name. Unsafe
    relative paths (``..``, absolute) raise :class:`UnsafePathError` before anything is
    written.
    """
    _check_workers(max_workers)
    local_dir = os.fspath(local_dir)
    expected: dict[str, FileEntry | int]
    if files is None:
        expected = dict(list_files(src, retry))
    else:
        expected = dict(files)
    checked = {check_relative_path(rel, argument="files"): rel for rel in expected}
    directories = {os.path.dirname(os.path.join(local_dir, *rel.split("/"))) for rel in checked}
    for directory in sorted(directories | {local_dir}):
        os.makedirs(directory, exist_ok=True)
    shared = Progress(progress)

    def task_for(rel: str, want: FileEntry | int) -> Callable[[Cancelled], None]:
        source = src.join(rel)
        final = os.path.join(local_dir, *rel.split("/"))
        what = f"download {source.display()} to {final!r}"

        def attempt(cancelled: Cancelled) -> None:
            report, undo = _counting(shared)
            hasher = new_hasher() if verify and isinstance(want, FileEntry) else None
            temporary = f"{final}.cairn-tmp-{uuid.uuid4().hex[:12]}"
            try:
                with src.filesystem.open_input_stream(source.path) as stream:
                    with open(temporary, "wb", buffering=0) as sink:
                        size = stream_copy(
                            stream, sink, _buffer(), hasher=hasher, progress=report,
                            cancelled=cancelled, raw_sink=True,
                        )
                if verify:
                    _check(source, want, size, hasher)
                os.replace(temporary, final)
            except BaseException:
                undo()
                _remove_local(temporary)
                raise

        def task(cancelled: Cancelled) -> None:
            try:
                call_with_retry(lambda: attempt(cancelled), retry, what=what)
            except (TransferCancelled, CairnError):
                raise
            except Exception as exc:
                raise _convert(exc, what) from exc

        return task

    started = time.perf_counter()
    tasks = {rel: task_for(rel, expected[original]) for rel, original in checked.items()}
    _, errors = _run_parallel(tasks, max_workers, collect_all=False)
    _raise_first(errors)
    logger.debug(
        "Downloaded %d files from %s to %s in %.3fs", len(tasks), src.display(), local_dir,
        time.perf_counter() - started,
    )


def _remove_local(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _check(source: StorageLocation, want: FileEntry | int, size: int, hasher: object) -> None:
    want_size = want.size if isinstance(want, FileEntry) else want
    if size != want_size:
        raise ChecksumMismatchError(
            f"{source.display()} is corrupt: expected {want_size} bytes, read {size}. "
            "The file was changed or truncated after it was committed."
        )
    if isinstance(want, FileEntry) and hasher is not None:
        actual = hasher.hexdigest()  # type: ignore[attr-defined]
        if actual != want.checksum:
            raise ChecksumMismatchError(
                f"{source.display()} is corrupt: expected {CHECKSUM_ALGORITHM} checksum "
                f"{want.checksum}, computed {actual}. The file was changed after it was "
                "committed."
            )


def _read_and_hash(
    loc: StorageLocation, rel: str, retry: RetryPolicy, want: FileEntry | None
) -> Callable[[Cancelled], FileEntry]:
    source = loc.join(rel)
    what = f"read {source.display()}"

    def attempt(cancelled: Cancelled) -> FileEntry:
        hasher = new_hasher()
        with loc.filesystem.open_input_stream(source.path) as stream:
            size = stream_copy(
                stream, None, _buffer(), hasher=hasher, progress=lambda _: None,
                cancelled=cancelled,
            )
        if want is not None:
            _check(source, want, size, hasher)
        return FileEntry(size=size, checksum=hasher.hexdigest())

    def task(cancelled: Cancelled) -> FileEntry:
        try:
            return call_with_retry(lambda: attempt(cancelled), retry, what=what)
        except (TransferCancelled, CairnError):
            raise
        except Exception as exc:
            raise _convert(exc, what) from exc

    return task


def compute_entries(
    loc: StorageLocation,
    files: Iterable[str],
    *,
    retry: RetryPolicy = DEFAULT_RETRY,
    max_workers: int = 8,
) -> dict[str, FileEntry]:
    """Read ``files`` (relative to ``loc``) from storage and return their entries.

    For checkpoints that are already on storage (registered by reference).
    """
    _check_workers(max_workers)
    names = sorted({check_relative_path(rel, argument="files") for rel in files})
    tasks = {rel: _read_and_hash(loc, rel, retry, None) for rel in names}
    results, errors = _run_parallel(tasks, max_workers, collect_all=False)
    _raise_first(errors)
    return {rel: results[rel] for rel in names}


def verify_directory(
    loc: StorageLocation,
    files: Mapping[str, FileEntry],
    *,
    retry: RetryPolicy = DEFAULT_RETRY,
    max_workers: int = 8,
) -> None:
    """Check that every file of ``files`` under ``loc`` has the recorded size and checksum.

    Reads everything, then raises for the bad files in path order: a
    :class:`CheckpointNotFoundError` when the first bad file is missing, else a
    :class:`ChecksumMismatchError`; the message names up to five bad files.
    """
    _check_workers(max_workers)
    tasks = {
        check_relative_path(rel, argument="files"): _read_and_hash(loc, rel, retry, entry)
        for rel, entry in files.items()
    }
    _, errors = _run_parallel(tasks, max_workers, collect_all=True)
    if not errors:
        return
    bad = sorted(errors)
    first = errors[bad[0]]
    if not isinstance(first, (CheckpointNotFoundError, ChecksumMismatchError)):
        raise first
    lines = [str(errors[rel]) for rel in bad[:_MAX_NAMED_FAILURES]]
    if len(bad) > _MAX_NAMED_FAILURES:
        lines.append(f"... and {len(bad) - _MAX_NAMED_FAILURES} more bad files")
    message = f"{len(bad)} of {len(files)} files under {loc.display()} failed verification: "
    raise type(first)(message + "; ".join(lines)) from first
