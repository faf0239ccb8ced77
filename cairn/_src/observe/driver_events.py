"""Events only the driver sees: what the observers of a run need beyond the event log.

Each is a frozen dataclass emitted once through the :class:`~.observer.EventStream`. The
ones the event log also keeps carry that record in :attr:`DriverEvent.logged`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from cairn._src.checkpoint.checkpoint import Checkpoint
from cairn._src.checkpoint.views import CheckpointView, ReadyCheckpoint
from cairn._src.errors import WorkerGroupError
from cairn._src.run.events import Commit, Event, Failure
from cairn._src.wire.messages import ReportMessage, UploadedMessage, UploadFailedMessage

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DriverEvent:
    """An event of the driver; :attr:`logged` is its event-log record, if it has one."""

    @property
    def logged(self) -> Event | None:
        return None


@dataclass(frozen=True)
class Reported(DriverEvent):
    """Rank ``message.rank`` made a report in attempt ``attempt`` (not yet committed)."""

    attempt: int
    message: ReportMessage


@dataclass(frozen=True)
class Uploaded(DriverEvent):
    """A rank finished uploading its part of a report's checkpoint."""

    message: UploadedMessage


@dataclass(frozen=True)
class UploadFailed(DriverEvent):
    """A rank's upload failed after its retries."""

    message: UploadFailedMessage


@dataclass(frozen=True)
class CheckpointCommitted(DriverEvent):
    """The checkpoint of ``ready`` was committed as ``view`` in ``seconds``."""

    record: Commit
    ready: ReadyCheckpoint
    view: CheckpointView
    seconds: float
    checkpoint: Checkpoint

    @property
    def logged(self) -> Event | None:
        return self.record


@dataclass(frozen=True)
class CommitFailed(DriverEvent):
    """The commit of ``ready`` failed with ``error``; ``skipped``: the run's
    ``upload_failure_policy="skip"`` drops the checkpoint and goes on."""

    ready: ReadyCheckpoint
    error: BaseException
    skipped: bool


@dataclass(frozen=True)
class CheckpointSkipped(DriverEvent):
    """The checkpoint of report ``index`` was dropped: a rank could not upload it."""

    index: int


@dataclass(frozen=True)
class AttemptFailed(DriverEvent):
    """An attempt failed: ``reason`` in full, ``error`` with each rank's exception."""

    record: Failure
    reason: str
    error: WorkerGroupError

    @property
    def logged(self) -> Event | None:
        return self.record


@dataclass(frozen=True)
class Notice(DriverEvent):
    """A line every enabled live view prints (which run starts, why the run gives up)."""

    line: str


@dataclass(frozen=True)
class WorkerGroupStarted(DriverEvent):
    """The backend started attempt ``attempt``'s ``world_size`` workers (an elastic range
    may give fewer than asked for)."""

    attempt: int
    world_size: int
