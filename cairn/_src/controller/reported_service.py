"""``get_all_reported_checkpoints()``: the controller's side.

:class:`ReportedCheckpointsService` (pure logic) holds the workers' requests and says
which can be answered: every report up to the request's index resolved (all ranks reached
it, its checkpoint committed, refused or skipped), and for ``VALIDATED`` no validation
pending among them; or the request's ``timeout_s`` passed (the answer is then what is known
at that moment, as in Ray Train). A request that can never be answered (a rank finished,
or did not arrive within the collective timeout) is a problem that fails the attempt,
naming the ranks. The worker's side is :mod:`cairn._src.worker.reported_client`.

The answer lists the run's kept checkpoints, as the controller's index has them (so a
restarted worker, or a new ``fit()`` of the run, sees those of earlier attempts too).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

from cairn._src.checkpoint.reported import (
    CheckpointConsistencyMode,
)
from cairn._src.controller.collective_service import CollectiveProblem
from cairn._src.controller.reports import ReportTracker, describe_ranks
from cairn._src.errors import CollectiveTimeoutError, ReportError
from cairn._src.wire.messages import ReportedCheckpointsRequest


@dataclass
class _Open:
    request: ReportedCheckpointsRequest
    arrived: float


class ReportedCheckpointsService:
    """The controller side, for one attempt. Not thread-safe: the controller loop owns it."""

    def __init__(self) -> None:
        self._open: list[_Open] = []

    def on_request(self, request: ReportedCheckpointsRequest, now: float | None = None) -> None:
        self._open.append(_Open(request, time.monotonic() if now is None else now))

    def take_answerable(
        self,
        tracker: ReportTracker,
        validation_pending: Callable[[int], bool],
        now: float | None = None,
    ) -> list[ReportedCheckpointsRequest]:
        """Requests to answer now; forgets them. ``validation_pending(index)``: whether a
        checkpoint of a report up to ``index`` has a validation pending."""
        now = time.monotonic() if now is None else now
        answer: list[ReportedCheckpointsRequest] = []
        still: list[_Open] = []
        for item in self._open:
            request = item.request
            resolved = not tracker.unresolved_before(request.index) and (
                request.consistency_mode != CheckpointConsistencyMode.VALIDATED.value
                or not validation_pending(request.index)
            )
            expired = request.timeout_s is not None and now - item.arrived >= request.timeout_s
            if resolved or expired:
                answer.append(request)
            else:
                still.append(item)
        self._open = still
        return answer

    def check(self, tracker: ReportTracker, done: Collection[int], timeout_s: float,
              now: float | None = None) -> CollectiveProblem | None:
        """A request that can never be answered: ranks that finished, or did not arrive
        within ``timeout_s``, short of the report it waits for."""
        now = time.monotonic() if now is None else now
        for item in self._open:
            request = item.request
            missing = tracker.missing_ranks(request.index)
            finished = sorted(set(missing) & set(done))
            if finished:
                return CollectiveProblem(finished[0], ReportError(
                    f"{describe_ranks(finished)} finished without reaching report "
                    f"{request.index}, which rank {request.rank} waits for in "
                    "get_all_reported_checkpoints(): every rank must call report() the same "
                    "number of times."), fatal=True)
            if missing and request.timeout_s is None and now - item.arrived > timeout_s:
                return CollectiveProblem(missing[0], CollectiveTimeoutError(
                    f"{describe_ranks(missing)} did not reach report {request.index} within "
                    f"{timeout_s:g}s while rank {request.rank} waited in "
                    "get_all_reported_checkpoints(): every rank must call report() the same "
                    "number of times (FailureConfig.collective_timeout_s)."), fatal=False)
        return None

