"""The error ``fit()`` raises when workers fail: a :class:`WorkerGroupError` carrying each
failed rank's own exception, as Ray Train's ``worker_failures``; the error a failed run
reads back with; whether a failure was damage of the resume checkpoint; the failure
counts written to the run index; and :class:`NotStarted`, the controller's signal that an
attempt's start failed on the driver's storage."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import cloudpickle

from cairn._src.controller.worker_failures import WorkerFailure, ordered_ranks
from cairn._src.errors import (
    CheckpointDamagedError,
    StorageError,
    WorkerGroupError,
    WorkerProcessError,
)
from cairn._src.storage.uris import redact_text

if TYPE_CHECKING:
    from cairn._src.checkpoint.manager import CheckpointManager
    from cairn._src.controller.attempt import Attempt
    from cairn._src.controller.failure_policy import AttemptFailure

logger = logging.getLogger(__name__)


def worker_exceptions(failures: Sequence[WorkerFailure]) -> dict[int, BaseException]:
    """``{rank: exception}`` for every failed rank, ordered by rank.

    A rank's first failure counts. Its exception is the object its train function raised,
    unpickled here; a rank that failed without one (it exited, was killed, lost its
    connection, hung), or whose exception cannot be unpickled in the driver, gets a
    :class:`WorkerProcessError` with the failure's text and traceback.
    """
    found: dict[int, BaseException] = {}
    for failure in failures:
        if failure.rank in found:
            continue
        exception: object = None
        if failure.exception is not None:
            try:
                exception = cloudpickle.loads(failure.exception)
            except Exception as exc:  # a class the driver cannot import, say
                logger.warning("The exception of rank %d cannot be unpickled in the driver "
                               "(%s: %s); keeping its text", failure.rank,
                               type(exc).__name__, exc)
        if not isinstance(exception, BaseException):
            text = failure.summary
            if failure.traceback:
                text += "\n" + failure.traceback.rstrip()
            exception = WorkerProcessError(text)
        found[failure.rank] = exception
    return dict(sorted(found.items()))


def worker_group_error(
    failures: Sequence[WorkerFailure], reason: str, run_path: str | None = None
) -> WorkerGroupError:
    """The error for an attempt that failed with ``failures`` (``reason``: their grouped
    text); ``run_path`` is where its committed checkpoints stay."""
    return WorkerGroupError(reason, worker_exceptions(failures), run_path)


# What the event log keeps of an error message: enough to say why, never a whole log.
MESSAGE_LIMIT = 2000


def error_summary(error: BaseException, ranks: Sequence[int]) -> dict[str, Any]:
    """A failure as the event log keeps it: ``{"type", "ranks", "message"}``, the message
    bounded and with any URI in it redacted (the log lives on storage)."""
    kind = type(error)
    name = kind.__qualname__ if kind.__module__ == "builtins" else (
        f"{kind.__module__.replace('cairn._src.errors', 'cairn')}.{kind.__qualname__}")
    message = redact_text(str(error))
    if len(message) > MESSAGE_LIMIT:
        message = message[: MESSAGE_LIMIT - 3] + "..."
    return {"type": name, "ranks": sorted(int(r) for r in ranks), "message": message}


def failure_records(failures: Sequence[WorkerFailure],
                    error: WorkerGroupError) -> list[dict[str, Any]]:
    """Each failed rank's error as the event log keeps it (:func:`error_summary` plus
    ``"frame"``: where it failed, or None), the causes first (the rank that died before
    the ranks whose collective then lost it; see ``worker_failures.cause_order``)."""
    frames: dict[int, dict[str, Any] | None] = {}
    for failure in failures:
        if frames.get(failure.rank) is None:
            frames[failure.rank] = failure.frame
    exceptions = error.worker_failures
    ranks = [r for r in ordered_ranks(list(failures)) if r in exceptions]
    ranks += [r for r in exceptions if r not in ranks]
    return [{**error_summary(exceptions[rank], ranks=(rank,)), "frame": frames.get(rank)}
            for rank in ranks]


def _kinds_of(error: type[Exception]) -> frozenset[str]:
    return frozenset({error.__name__}).union(*(_kinds_of(s) for s in error.__subclasses__()))


# What a rank's failure names when it is damage (CheckpointDamagedError, each subclass).
DAMAGE = _kinds_of(CheckpointDamagedError)


def damaged_resume(attempt: Attempt, failure: AttemptFailure,
                    error: WorkerGroupError) -> str | None:
    """The resume checkpoint, when a rank failed on damage while resuming from it (and
    the failure is not fatal): it is a suspect unless it was verified in full."""
    resume = attempt.resume
    if resume is None or failure.fatal or not any(
            isinstance(exc, CheckpointDamagedError)
            for exc in error.worker_failures.values()):
        return None
    return resume.dir_name


def run_error(errors: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The error a failed run reads back with (``Result.from_path``, ``cairn show``): the
    first cause's own exception (``errors`` come causes first), as the user's train
    function raised it, with every rank that failed the same way."""
    if not errors:
        return None
    first = errors[0]
    ranks = [rank for error in errors if (error["type"], error["message"]) == (
        first["type"], first["message"]) for rank in error["ranks"]]
    return {"type": first["type"], "ranks": sorted(ranks), "message": first["message"]}


def save_counts(manager: CheckpointManager, **counts: int) -> None:
    """Write the failure counts to the run index; on a storage error they stay counted in
    the manager's index (:meth:`~CheckpointManager.save_index` applies them first) and the
    next index write that succeeds, the next attempt's start, records them."""
    try:
        manager.save_index(**counts)
    except (StorageError, OSError) as exc:
        logger.warning("The run index could not be written (%s); the failure is counted "
                       "and recorded by the next index write", exc)


class NotStarted(Exception):
    """The attempt's start failed on the driver's storage before any worker started."""

    def __init__(self, error: StorageError | OSError) -> None:
        super().__init__(str(error))
        self.error = error
