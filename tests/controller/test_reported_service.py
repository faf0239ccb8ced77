"""When the controller answers get_all_reported_checkpoints() (pure logic)."""

from __future__ import annotations

import time

import pytest

from cairn._src.checkpoint.index import CheckpointRecord
from cairn._src.checkpoint.reported import CheckpointConsistencyMode, check_timeout
from cairn._src.checkpoint.retention import KeepLatest, decide_retention
from cairn._src.controller.reported_service import ReportedCheckpointsService
from cairn._src.controller.reports import ReportTracker
from cairn._src.controller.validations import ProtectPending
from cairn._src.errors import ReportError
from cairn._src.storage.transfer import FileEntry
from cairn._src.wire.messages import (
    CheckpointIntent,
    ReportedCheckpointsRequest,
    ReportMessage,
    UploadedMessage,
)


def request(rank: int, index: int, mode: str = "COMMITTED",
            timeout_s: float | None = None) -> ReportedCheckpointsRequest:
    return ReportedCheckpointsRequest(rank, index, index, mode, timeout_s)


def checkpoint_report(rank: int, index: int) -> ReportMessage:
    intent = CheckpointIntent(f"checkpoint_{index:06d}", "SYNC", files={"m": 1})
    return ReportMessage(rank, index, {}, intent, time.time())


def test_answered_once_every_rank_arrived_and_the_checkpoint_committed() -> None:
    tracker = ReportTracker(2, used_dir_names=set())
    service = ReportedCheckpointsService()
    never: list[int] = []
    tracker.on_report(checkpoint_report(0, 1))
    service.on_request(request(0, 1), now=0.0)
    assert service.take_answerable(tracker, lambda i: False, now=1.0) == []
    tracker.on_report(ReportMessage(1, 1, {}, None, time.time()))
    assert service.take_answerable(tracker, lambda i: False, now=1.0) == []  # not uploaded
    tracker.on_uploaded(UploadedMessage(0, 1, {"m": FileEntry(1, "c")}, None, 1, 0.0))
    [ready] = tracker.take_ready()
    assert service.take_answerable(tracker, lambda i: False, now=1.0) == []  # committing
    tracker.on_committed(ready.index)
    [answered] = service.take_answerable(tracker, lambda i: False, now=1.0)
    assert answered.rank == 0
    assert service.take_answerable(tracker, lambda i: False) == never


def test_validated_waits_for_pending_validations_committed_does_not() -> None:
    tracker = ReportTracker(1, used_dir_names=set())
    service = ReportedCheckpointsService()
    service.on_request(request(0, 0, "VALIDATED"), now=0.0)
    service.on_request(request(0, 0, "COMMITTED"), now=0.0)
    [committed] = service.take_answerable(tracker, lambda i: True, now=0.0)
    assert committed.consistency_mode == "COMMITTED"
    [validated] = service.take_answerable(tracker, lambda i: False, now=0.0)
    assert validated.consistency_mode == "VALIDATED"


def test_timeout_answers_with_what_is_known() -> None:
    tracker = ReportTracker(2, used_dir_names=set())
    service = ReportedCheckpointsService()
    tracker.on_report(ReportMessage(0, 1, {}, None, time.time()))
    service.on_request(request(0, 1, timeout_s=2.0), now=0.0)
    assert service.take_answerable(tracker, lambda i: False, now=1.0) == []
    assert len(service.take_answerable(tracker, lambda i: False, now=2.0)) == 1


def test_a_request_that_cannot_be_answered_is_a_problem_naming_the_ranks() -> None:
    tracker = ReportTracker(3, used_dir_names=set())
    tracker.on_report(ReportMessage(0, 1, {}, None, time.time()))
    service = ReportedCheckpointsService()
    service.on_request(request(0, 1), now=0.0)
    problem = service.check(tracker, done=[2], timeout_s=10.0, now=1.0)
    assert problem is not None and problem.fatal and problem.rank == 2
    assert "rank 2 finished without reaching report 1, which rank 0 waits for" in problem.summary
    problem = service.check(tracker, done=[], timeout_s=10.0, now=11.0)
    assert problem is not None and not problem.fatal
    assert "ranks 1, 2 did not reach report 1 within 10s" in problem.summary


def test_bad_arguments_name_the_value_and_what_is_accepted() -> None:
    with pytest.raises(ReportError, match=r"consistency_mode='LATEST'\) is not one of "
                                          r"'COMMITTED', 'VALIDATED'"):
        CheckpointConsistencyMode.parse("LATEST")
    assert CheckpointConsistencyMode.parse("validated") is CheckpointConsistencyMode.VALIDATED
    with pytest.raises(ReportError, match=r"timeout_s=-1\) must be None .* or a number of "
                                          r"seconds > 0"):
        check_timeout(-1)
    assert check_timeout(None) is None and check_timeout(2) == 2.0


def test_retention_never_drops_a_checkpoint_whose_validation_is_pending() -> None:
    records = [CheckpointRecord(dir_name=f"c{i}", report_index=i) for i in range(1, 5)]
    pending = {"c1"}
    policy = ProtectPending(KeepLatest(1), lambda: set(pending))
    assert decide_retention(policy, records) == [True, False, False, True]
    pending.clear()
    assert decide_retention(policy, records) == [False, False, False, True]
