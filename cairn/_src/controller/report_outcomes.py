"""What an attempt's loop does with a report that will not commit (the loop's thread).

* :func:`upload_failed`: a rank's upload failed (after retries, or at once for a
  mistake); under ``upload_failure_policy="skip"`` the report is skipped (its directory
  deleted, when Cairn's own uploads wrote it), otherwise the attempt fails;
* :func:`not_handed_to_commit`: the driver could not record a ready report's validation
  request (a storage error), so the report is never committed: the attempt fails with
  that error, and the directory is left for the cleanup of uncommitted reports;
* :func:`driver_failure`: a storage error of the driver's own while it handled a rank's
  message: the attempt's failure says so (the rank's connection is fine).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from cairn._src.checkpoint.views import ReadyCheckpoint
from cairn._src.controller.attempt import Attempt
from cairn._src.controller.reports import Verdict
from cairn._src.controller.worker_failures import WorkerFailure
from cairn._src.errors import StorageError
from cairn._src.observe.driver_events import CheckpointSkipped, UploadFailed
from cairn._src.wire.messages import CommittedMessage, UploadFailedMessage

if TYPE_CHECKING:
    from cairn._src.controller.attempt_loop import LoopParts

logger = logging.getLogger(__name__)


def upload_failed(attempt: Attempt, parts: LoopParts, message: UploadFailedMessage, *,
                  send_verdicts: Callable[[list[Verdict]], None],
                  delete: Callable[[str], None]) -> None:
    """A rank's upload of report ``message.index`` failed."""
    parts.events.emit(UploadFailed(message))
    if parts.run_config.checkpoint_config.upload_failure_policy != "skip":
        # Fail now: an ASYNC upload's error would otherwise surface only at that rank's
        # next report(), while training goes on past a lost checkpoint.
        if not attempt.has_failure(message.rank):
            attempt.failures.append(WorkerFailure(
                rank=message.rank, traceback="",
                # (Not "after retries": a mistake such as a wrong checkpoint_upload_fn
                # result is never retried; a storage error says how often it was tried.)
                summary=f"The upload of report {message.index}'s checkpoint failed: "
                f"{message.error}"))
        return
    reason = (f"The checkpoint of report {message.index} was skipped: rank "
              f"{message.rank}: {message.error}")
    pending, refusals = attempt.tracker.skip(message.index, reason)
    logger.warning("Skipping the checkpoint of report %d: rank %d could not upload it (%s)",
                   message.index, message.rank, message.error)
    if pending is not None and pending.dir_name is not None and pending.own_upload:
        # Only a directory Cairn's own uploads wrote: a NO_UPLOAD or checkpoint_upload_fn
        # report's names the user's data.
        delete(pending.dir_name)
        attempt.skipped_dirs[message.index] = pending.dir_name
    elif message.index in attempt.skipped_dirs:
        # A second rank's upload of a report already skipped failed too: what it wrote
        # after the first deletion goes as well.
        delete(attempt.skipped_dirs[message.index])
    send_verdicts(refusals)  # ranks held for a shared directory: not uploaded
    parts.channels.broadcast(attempt, CommittedMessage(message.index, None, skipped=True,
                                                       error=reason))
    parts.events.emit(CheckpointSkipped(message.index))


def not_handed_to_commit(attempt: Attempt, ready: ReadyCheckpoint,
                         error: StorageError) -> None:
    """The validation request of ``ready`` could not be recorded before its commit."""
    logger.error("Could not record the validation request of report %d (%s) before its "
                 "commit: %s", ready.index, ready.dir_name, error)
    attempt.tracker.abandon(ready.index)
    attempt.failures.append(WorkerFailure(
        rank=min(ready.ranks, default=0), traceback="",
        summary=f"The driver could not record the validation request of checkpoint "
        f"{ready.dir_name} (report {ready.index}) before its commit, so it was not "
        f"committed: {type(error).__name__}: {error}"))


def driver_failure(attempt: Attempt, message: object,
                   error: StorageError | OSError) -> None:
    """A storage (or OS) error of the driver's own while it handled a rank's ``message``."""
    rank = getattr(message, "rank", None)
    rank = rank if isinstance(rank, int) else 0
    logger.error("The driver failed to handle rank %d's %s", rank, type(message).__name__,
                 exc_info=error)
    attempt.failures.append(WorkerFailure(
        rank=rank, traceback="",
        summary=f"The driver could not handle rank {rank}'s {type(message).__name__}: "
        f"{type(error).__name__}: {error}"))
