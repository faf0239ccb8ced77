"""The controller's side of the Ray Train v2 worker calls beyond ``report()``.

One :class:`AttemptServices` per attempt gathers ``cairn.collective`` calls and answers
``get_all_reported_checkpoints()`` requests; the controller hands it the messages it does
not handle itself, calls :meth:`AttemptServices.answer` whenever a report may have been
resolved (a commit, a validation, every loop turn) and :meth:`AttemptServices.check` with
its progress checks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection

from cairn._src.checkpoint.manager import CheckpointManager
from cairn._src.checkpoint.retention import ray_order
from cairn._src.checkpoint.views import CheckpointView
from cairn._src.config.run import CheckpointConfig
from cairn._src.controller.collective_service import CollectiveProblem, CollectiveTracker
from cairn._src.controller.reported_service import ReportedCheckpointsService
from cairn._src.controller.reports import ReportTracker
from cairn._src.controller.validations import ValidationRunner
from cairn._src.errors import CairnError
from cairn._src.wire.messages import (
    CollectiveMessage,
    ReportedCheckpointsReply,
    ReportedCheckpointsRequest,
)

logger = logging.getLogger(__name__)

Send = Callable[[int, object], None]


class AttemptServices:
    """Collectives and reported-checkpoint requests of one attempt (the controller loop's)."""

    def __init__(self, world_size: int, manager: CheckpointManager,
                 validations: ValidationRunner, checkpoint_config: CheckpointConfig) -> None:
        self.collectives = CollectiveTracker(world_size)
        self.reported = ReportedCheckpointsService()
        self._manager = manager
        self._validations = validations
        self._checkpoint_config = checkpoint_config

    def handle(self, message: object, tracker: ReportTracker, send: Send) -> bool:
        """Act on ``message`` if it is one of these services'; whether it was."""
        if isinstance(message, CollectiveMessage):
            for rank, release in self.collectives.on_arrive(message):
                send(rank, release)
            return True
        if isinstance(message, ReportedCheckpointsRequest):
            self.reported.on_request(message)
            self.answer(tracker, send)
            return True
        return False

    def answer(self, tracker: ReportTracker, send: Send) -> None:
        """Answer the get_all_reported_checkpoints() requests that can be answered now."""
        requests = self.reported.take_answerable(tracker, self._validations.pending_up_to)
        if not requests:
            return
        listing = self.listing()
        for request in requests:
            send(request.rank, ReportedCheckpointsReply(request.request_id, listing))

    def listing(self) -> tuple[tuple[CheckpointView, str], ...]:
        """The run's kept checkpoints in Ray's order, each with its status."""
        config = self._checkpoint_config
        records = ray_order(list(self._manager.index.checkpoints),
                            config.checkpoint_score_attribute, config.checkpoint_score_order)
        listed: list[tuple[CheckpointView, str]] = []
        for record in records:
            try:
                view = self._manager.view(record)
            except CairnError as exc:
                # As choose_resume does: a record the driver cannot open (a scheme it
                # cannot resolve, a damaged reference) is left out, not the rank's fault.
                logger.warning("Not listing %s in get_all_reported_checkpoints(): %s",
                               record.dir_name, exc)
                continue
            listed.append((view, self._validations.status(record.dir_name).value))
        return tuple(listed)

    def check(self, tracker: ReportTracker, done: Collection[int],
              timeout_s: float) -> CollectiveProblem | None:
        return (self.collectives.check(done, timeout_s)
                or self.reported.check(tracker, done, timeout_s))
