"""The thread pool behind directory transfers: one task per file, first failure wins.

Also the small pieces every transfer shares: converting backend errors to Cairn's,
progress accounting that survives retries, and argument checks.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import TypeVar

from cairn._src.errors import CairnError, CheckpointNotFoundError, ConfigError, StorageError
from cairn._src.storage.checksum import Progress, TransferCancelled
from cairn._src.storage.retry import RetryPolicy, call_with_retry

R = TypeVar("R")
# A task receives this: it returns True once another task failed and the pool is stopping.
Cancelled = Callable[[], bool]


def convert_error(exc: BaseException, what: str) -> BaseException:
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


def with_retry(fn: Callable[[], R], retry: RetryPolicy, what: str) -> R:
    """``fn()`` retried per ``retry``; what still fails is raised as Cairn's error for a
    failure of ``what`` (:func:`convert_error`), with the backend's error chained. A
    cancelled transfer and Cairn's own errors pass through unchanged. The one retry
    wrapper of the per-file transfer tasks."""
    try:
        return call_with_retry(fn, retry, what=what)
    except (TransferCancelled, CairnError):
        raise
    except Exception as exc:
        raise convert_error(exc, what) from exc


def run_parallel(
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


def raise_first(errors: dict[str, BaseException]) -> None:
    """Raise the first real error of ``errors`` (cancellations are echoes of it)."""
    real = {name: exc for name, exc in errors.items() if not isinstance(exc, TransferCancelled)}
    if real:
        raise next(iter(real.values()))


def counting(progress: Progress) -> tuple[Callable[[int], None], Callable[[], None]]:
    """A progress function that remembers its total, and a function taking it back."""
    sent = [0]

    def report(delta: int) -> None:
        sent[0] += delta
        progress(delta)

    def undo() -> None:
        progress(-sent[0])
        sent[0] = 0

    return report, undo


def check_workers(max_workers: int) -> None:
    """Raise :class:`ConfigError` unless ``max_workers`` is an int >= 1."""
    if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
        raise ConfigError(f"max_workers={max_workers!r} must be an integer >= 1.")
