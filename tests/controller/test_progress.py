from __future__ import annotations

import time

from cairn._src.controller.progress import check_progress
from cairn._src.controller.reports import ReportTracker
from cairn._src.wire.messages import CheckpointIntent, ReportMessage


def report(rank: int, index: int, checkpoint: bool = False) -> ReportMessage:
    intent = CheckpointIntent(f"checkpoint_{index:06d}", "SYNC", files={f"r{rank}": 1}) \
        if checkpoint else None
    return ReportMessage(rank, index, {}, intent, time.time())


def test_all_in_step_is_fine() -> None:
    tracker = ReportTracker(2, used_dir_names=set())
    for rank in (0, 1):
        tracker.on_report(report(rank, 1))
    assert check_progress(tracker, {0, 1}, num_workers=2, timeout_s=5) is None


def test_timeout_names_missing_ranks_and_is_retryable() -> None:
    tracker = ReportTracker(3, used_dir_names=set())
    tracker.on_report(report(0, 1, checkpoint=True))
    problem = check_progress(tracker, set(), num_workers=3, timeout_s=5,
                             now=time.monotonic() + 6)
    assert problem is not None and not problem.fatal
    assert "ranks 1, 2 did not reach report 1 within 5s of rank 0" in problem.summary


def test_finished_rank_that_skipped_a_checkpoint_report_is_fatal() -> None:
    tracker = ReportTracker(2, used_dir_names=set())
    tracker.on_report(report(0, 1, checkpoint=True))
    problem = check_progress(tracker, {1}, num_workers=2, timeout_s=5)
    assert problem is not None and problem.fatal and problem.rank == 1
    assert "rank 1 finished after 0 reports without reaching checkpoint report 1" \
        in problem.summary


def test_different_counts_at_the_end_are_fatal() -> None:
    tracker = ReportTracker(2, used_dir_names=set())
    tracker.on_report(report(0, 1))
    tracker.on_report(report(0, 2))
    tracker.on_report(report(1, 1))
    problem = check_progress(tracker, {0, 1}, num_workers=2, timeout_s=5)
    assert problem is not None and problem.fatal
    assert "(rank 0: 2, rank 1: 1)" in problem.summary
