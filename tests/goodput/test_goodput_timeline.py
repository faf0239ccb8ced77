"""The goodput timeline's intervals, from hand-made event logs (pure logic)."""

from __future__ import annotations

import random

import pytest

from cairn._src.goodput.timeline import Interval, Lane, build_timeline, describe_failure
from cairn._src.run.status import ErrorInfo


def spans(lane: Lane) -> list[tuple[float, float, str]]:
    return [(round(i.start, 6), round(i.end, 6), i.category) for i in lane.intervals]


def test_one_attempt_two_ranks_with_stalls() -> None:
    events = [
        {"type": "session_start", "t": 100.0},
        {"type": "attempt_start", "attempt": 0, "t": 100.0},
        {"type": "train_start", "attempt": 0, "t": 101.0},
        {"type": "commit", "index": 3, "t": 103.0, "seconds": 0.1, "bytes": 10},
        {"type": "blocked", "rank": 0, "kind": "checkpoint_stall", "seconds": 0.5, "t": 103.0},
        {"type": "blocked", "rank": 1, "kind": "checkpoint_stall", "seconds": 1.0, "t": 104.0},
        {"type": "session_end", "t": 110.0, "status": "finished"},
    ]
    timeline = build_timeline(events)
    assert timeline.started_at == 100.0 and timeline.end == 10.0
    assert timeline.commits == (3.0,)
    assert [(lane.attempt, lane.rank) for lane in timeline.lanes] == [(0, 0), (0, 1)]
    assert spans(timeline.lanes[0]) == [(0, 1, "startup"), (1, 2.5, "training"),
                                        (2.5, 3, "checkpoint_stall"), (3, 10, "training")]
    assert spans(timeline.lanes[1]) == [(0, 1, "startup"), (1, 3, "training"),
                                        (3, 4, "checkpoint_stall"), (4, 10, "training")]
    assert timeline.lanes[1].label == "attempt 0 · rank 1"
    assert timeline.lanes[0].seconds("training") == pytest.approx(8.5)


FAILED_RUN = [
    {"type": "session_start", "t": 0.0},
    {"type": "attempt_start", "attempt": 0, "t": 0.0, "resume": None},
    {"type": "train_start", "attempt": 0, "t": 1.0},
    {"type": "commit", "index": 2, "t": 4.0},
    {"type": "blocked", "rank": 0, "kind": "checkpoint_stall", "seconds": 0.5, "t": 4.0},
    # A stall after the last commit is lost work: the next attempt redoes it.
    {"type": "blocked", "rank": 0, "kind": "checkpoint_stall", "seconds": 0.5, "t": 5.5},
    {"type": "failure", "attempt": 0, "t": 6.0, "ranks": [2], "reason": "[rank 2] died",
     "last_commit_t": 4.0,
     "errors": [{"type": "cairn.WorkerProcessError", "ranks": [2], "message": "killed\nby 9"}]},
    {"type": "attempt_start", "attempt": 1, "t": 6.5, "resume": "checkpoint_000002"},
    {"type": "workers_ready", "attempt": 1, "t": 7.5},
    {"type": "train_start", "attempt": 1, "t": 8.0},
    {"type": "session_end", "t": 12.0, "status": "finished"},
]


def test_a_failure_gives_lost_work_then_recovery_on_every_rank() -> None:
    timeline = build_timeline(FAILED_RUN)
    # Rank 1 never appears in the log: ranks are 0..N-1, so it has lanes too.
    assert [lane.label for lane in timeline.lanes] == [
        "attempt 0 · rank 0", "attempt 0 · rank 1", "attempt 0 · rank 2",
        "attempt 1 · rank 0", "attempt 1 · rank 1", "attempt 1 · rank 2"]
    assert spans(timeline.lanes[0]) == [(0, 1, "startup"), (1, 3.5, "training"),
                                        (3.5, 4, "checkpoint_stall"), (4, 6, "lost_work")]
    assert spans(timeline.lanes[2]) == [(0, 1, "startup"), (1, 4, "training"),
                                        (4, 6, "lost_work")]
    # Recovery is counted from the failure, as the goodput summary does.
    assert spans(timeline.lanes[4]) == [(6, 8, "recovery"), (8, 12, "training")]
    (failure,) = timeline.failures
    assert (failure.attempt, failure.t, failure.label) == (0, 6.0, "rank 2: WorkerProcessError")
    assert failure.detail == "rank 2: WorkerProcessError (killed)"
    assert failure.as_dict()["errors"] == [
        {"type": "cairn.WorkerProcessError", "ranks": [2], "message": "killed\nby 9"}]


def test_the_order_of_the_log_does_not_matter() -> None:
    shuffled = list(FAILED_RUN)
    random.Random(3).shuffle(shuffled)
    assert build_timeline(shuffled) == build_timeline(FAILED_RUN)


def test_a_driver_killed_without_a_word_ends_its_attempt_at_its_last_event() -> None:
    timeline = build_timeline([
        {"type": "session_start", "t": 0.0},
        {"type": "attempt_start", "attempt": 0, "t": 0.0},
        {"type": "first_report", "attempt": 0, "t": 1.0},  # a log without train_start
        {"type": "commit", "index": 1, "t": 3.0},
        {"type": "session_start", "t": 20.0},
        {"type": "attempt_start", "attempt": 1, "t": 20.0},
        {"type": "train_start", "attempt": 1, "t": 21.0},
        {"type": "session_end", "t": 25.0},
    ])
    # No rank named anywhere: one lane per attempt.
    assert [lane.label for lane in timeline.lanes] == ["attempt 0", "attempt 1"]
    assert spans(timeline.lanes[0]) == [(0, 1, "startup"), (1, 3, "training")]
    # A new driver starts afresh: start-up, not recovery.
    assert spans(timeline.lanes[1]) == [(20, 21, "startup"), (21, 25, "training")]
    assert timeline.failures == ()


def test_a_failure_without_a_commit_loses_the_whole_attempt_after_start_up() -> None:
    timeline = build_timeline([
        {"type": "session_start", "t": 0.0},
        {"type": "attempt_start", "attempt": 0, "t": 0.0},
        {"type": "train_start", "attempt": 0, "t": 2.0},
        {"type": "failure", "attempt": 0, "t": 5.0, "ranks": [0], "reason": "boom",
         "last_commit_t": 0.0},
        {"type": "session_end", "t": 5.5, "status": "failed"},
    ])
    assert spans(timeline.lanes[0]) == [(0, 2, "startup"), (2, 5, "lost_work")]
    assert timeline.failures[0].label == "boom"


def test_untrusted_records_are_skipped() -> None:
    assert build_timeline([]).lanes == ()
    assert build_timeline([]).started_at is None
    timeline = build_timeline([
        "not a record", {"type": "session_start"}, {"type": 5, "t": 1.0},
        {"type": "session_start", "t": float("nan")},
        {"type": "session_start", "t": 0.0},
        {"type": "attempt_start", "attempt": "zero", "t": 0.0},
        {"type": "train_start", "t": True},
        {"type": "train_start", "t": 1.0},
        {"type": "blocked", "rank": -1, "seconds": 1.0, "t": 2.0},
        {"type": "blocked", "rank": 0, "seconds": "long", "t": 2.0},
        {"type": "blocked", "rank": 10**12, "seconds": 1.0, "t": 3.0},
        {"type": "failure", "t": 4.0, "errors": "abc", "ranks": "x", "reason": 7},
    ])
    # The absurd rank does not make a trillion lanes.
    assert [(lane.attempt, lane.rank) for lane in timeline.lanes] == [(0, 10**12)]
    # A failure that does not say since when its work is lost: the whole attempt.
    assert spans(timeline.lanes[0]) == [(0, 1, "startup"), (1, 4, "lost_work")]
    assert timeline.failures[0].label == "failed"


def test_describe_failure_groups_ranks_by_error_type() -> None:
    errors = [ErrorInfo("RuntimeError", (2,), "boom"), ErrorInfo("ValueError", (1,), "bad"),
              ErrorInfo("RuntimeError", (0,), "boom")]
    label, detail = describe_failure(errors, "ignored")
    assert label == "ranks 0, 2: RuntimeError; rank 1: ValueError"
    assert detail == "ranks 0, 2: RuntimeError; rank 1: ValueError (boom)"
    label, detail = describe_failure([], "x" * 300)
    assert len(label) == 40 and label.endswith("…") and len(detail) == 120


def test_intervals_serialize() -> None:
    assert Interval(0.0, 1.0, "training").as_dict() == {"start": 0.0, "end": 1.0,
                                                        "category": "training"}
    assert build_timeline(FAILED_RUN).as_dict()["lanes"][0]["attempt"] == 0


def test_the_rank_that_died_comes_first_in_the_failure_note() -> None:
    timeline = build_timeline([
        {"type": "session_start", "t": 0.0},
        {"type": "attempt_start", "attempt": 0, "t": 0.0},
        {"type": "failure", "attempt": 0, "t": 5.0, "ranks": [2, 0], "reason": "x",
         "errors": [{"type": "RuntimeError", "ranks": [0], "message": "Connection closed by peer"},
                    {"type": "cairn.WorkerProcessError", "ranks": [2],
                     "message": "Worker rank 2 (pid 9) was killed by SIGKILL"}]},
        {"type": "session_end", "t": 5.5, "status": "failed"},
    ])
    mark = timeline.failures[0]
    assert mark.label == "rank 2: WorkerProcessError; rank 0: RuntimeError"
    assert "(Worker rank 2 (pid 9) was killed by SIGKILL)" in mark.detail


def test_a_lane_names_where_its_rank_restored_from() -> None:
    events = [
        {"type": "session_start", "t": 0.0},
        {"type": "attempt_start", "attempt": 0, "t": 0.0},
        {"type": "train_start", "attempt": 0, "t": 1.0},
        {"type": "failure", "attempt": 0, "t": 5.0, "ranks": [1], "reason": "killed"},
        {"type": "attempt_start", "attempt": 1, "t": 5.5, "kept": [0], "replaced": [1]},
        {"type": "restored", "t": 6.0, "rank": 0, "kind": "memory", "index": 2,
         "peer": None, "memory_bytes": 10, "peer_bytes": 0, "bytes": 0, "seconds": 0.1,
         "reason": ""},
        {"type": "restored", "t": 6.2, "rank": 1, "kind": "peer+storage", "index": 2,
         "peer": 0, "memory_bytes": 0, "peer_bytes": 10, "bytes": 3, "seconds": 0.3,
         "reason": "no verified copy of ['rank_1/rank_state.pt'] in memory"},
        {"type": "train_start", "attempt": 1, "t": 6.5},
        {"type": "session_end", "t": 9.0, "status": "finished"},
    ]
    lanes = build_timeline(events).lanes
    assert [lane.label for lane in lanes] == [
        "attempt 0 · rank 0", "attempt 0 · rank 1", "attempt 1 · rank 0 · from memory",
        "attempt 1 · rank 1 · from peer rank 0+storage"]
    assert lanes[3].as_dict()["restored_from"] == "peer rank 0+storage"
    assert "restored_from" not in lanes[0].as_dict()
