from __future__ import annotations

import pytest

from cairn._src.controller.failure_policy import AttemptFailure, FailureDecision, FailurePolicy
from cairn._src.controller.worker_failures import WorkerFailure, group_failures
from cairn._src.goodput.summary import summarize

RETRY, RAISE = FailureDecision.RETRY, FailureDecision.RAISE


@pytest.mark.parametrize(
    ("max_failures", "so_far", "expected"),
    [(0, 0, RAISE), (1, 0, RETRY), (1, 1, RAISE), (-1, 1000, RETRY)],
)
def test_failure_budget(max_failures: int, so_far: int, expected: FailureDecision) -> None:
    failure = AttemptFailure(ranks=(0,), reason="boom")
    assert FailurePolicy(max_failures).decide(failure, so_far) is expected


def test_fatal_failures_are_never_retried() -> None:
    failure = AttemptFailure(ranks=(0,), reason="bad input", fatal=True)
    assert FailurePolicy(-1).decide(failure, 0) is RAISE


def test_errors_are_grouped_by_rank() -> None:
    text = group_failures([
        WorkerFailure(rank=2, summary="ValueError: x", traceback="tb"),
        WorkerFailure(rank=0, summary="ValueError: x", traceback="tb"),
        WorkerFailure(rank=1, summary="Worker rank 1 was killed by SIGKILL", traceback=""),
    ])
    assert text.startswith("[ranks 0, 2] ValueError: x (and 1 more)")
    assert "[rank 1] Worker rank 1 was killed by SIGKILL" in text


def test_goodput_summary_accounts_for_each_category() -> None:
    events = [
        {"type": "session_start", "t": 0.0},
        {"type": "attempt_start", "attempt": 0, "t": 0.0},
        {"type": "first_report", "attempt": 0, "t": 1.0},
        {"type": "blocked", "rank": 0, "seconds": 2.0, "t": 3.0},
        {"type": "blocked", "rank": 1, "seconds": 4.0, "t": 3.0},
        {"type": "commit", "index": 1, "bytes": 10, "t": 5.0},
        {"type": "failure", "attempt": 0, "t": 8.0, "last_commit_t": 5.0},
        {"type": "attempt_start", "attempt": 1, "t": 8.5},
        {"type": "first_report", "attempt": 1, "t": 10.0},
        {"type": "session_end", "t": 20.0},
    ]
    summary = summarize(events)
    assert summary.wall_s == 20.0
    assert summary.startup_s == 1.0
    # Both ranks blocked from 1 to 3 (rank 1's wait before the first report is start-up):
    # the job stalls 2 s, once however many ranks wait.
    assert summary.checkpoint_blocked_s == 2.0
    assert summary.recovery_s == 2.0
    assert summary.lost_work_s == 3.0
    assert summary.productive_s == 12.0
    assert summary.goodput == pytest.approx(0.6)
    assert (summary.attempts, summary.failures, summary.uploaded_bytes) == (2, 1, 10)
    assert "goodput" in summary.format()


def test_goodput_of_a_driver_that_died_counts_up_to_its_last_event() -> None:
    events = [
        {"type": "session_start", "t": 0.0},
        {"type": "commit", "t": 4.0},
        {"type": "session_start", "t": 10.0},
        {"type": "session_end", "t": 12.0},
    ]
    assert summarize(events).wall_s == 6.0


def test_start_up_and_recovery_end_when_training_starts() -> None:
    events = [
        {"type": "session_start", "t": 0.0},
        {"type": "attempt_start", "attempt": 0, "t": 0.0},
        {"type": "train_start", "attempt": 0, "t": 0.5},
        {"type": "first_report", "attempt": 0, "t": 5.0},
        {"type": "failure", "attempt": 0, "t": 12.0, "last_commit_t": 10.0},
        {"type": "attempt_start", "attempt": 1, "t": 12.2},
        {"type": "train_start", "attempt": 1, "t": 12.6},
        {"type": "first_report", "attempt": 1, "t": 17.6},
        {"type": "session_end", "t": 30.0},
    ]
    summary = summarize(events)
    assert summary.startup_s == 0.5
    assert summary.recovery_s == pytest.approx(0.6)
    assert summary.lost_work_s == 2.0
