"""The goodput summary counts each second once, as the timeline draws it; the timeline of
a crash-looping (or forged) log stays small."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from cairn._src.cli.main import main
from cairn._src.goodput import timeline as timeline_module
from cairn._src.goodput.summary import GoodputSummary, summarize
from cairn._src.goodput.timeline import CATEGORIES, Timeline, build_timeline
from cairn._src.run.layout import EVENTS_DIR, INDEX_NAME

Record = dict[str, Any]

# The controller writes last_commit_t = the attempt's start when it never committed.
FAILED_BEFORE_ITS_FIRST_COMMIT: list[Record] = [
    {"type": "session_start", "t": 1000.0},
    {"type": "attempt_start", "attempt": 0, "t": 1000.0},
    {"type": "train_start", "attempt": 0, "t": 1010.0},
    {"type": "failure", "attempt": 0, "t": 1100.0, "ranks": [0], "reason": "boom",
     "last_commit_t": 1000.0},
    {"type": "attempt_start", "attempt": 1, "t": 1101.0},
    {"type": "train_start", "attempt": 1, "t": 1110.0},
    {"type": "session_end", "t": 1200.0, "status": "finished"},
]

STALLS_AFTER_THE_LAST_COMMIT: list[Record] = [
    {"type": "session_start", "t": 0.0},
    {"type": "attempt_start", "attempt": 0, "t": 0.0},
    {"type": "train_start", "attempt": 0, "t": 2.0},
    {"type": "blocked", "rank": 0, "seconds": 1.0, "t": 5.0},
    {"type": "commit", "index": 1, "t": 6.0, "bytes": 5},
    # Half before the last commit, half after it.
    {"type": "blocked", "rank": 0, "seconds": 2.0, "t": 7.0},
    {"type": "blocked", "rank": 0, "seconds": 1.5, "t": 10.0},
    {"type": "failure", "attempt": 0, "t": 12.0, "ranks": [0], "reason": "x",
     "last_commit_t": 6.0},
    {"type": "attempt_start", "attempt": 1, "t": 13.0},
    {"type": "train_start", "attempt": 1, "t": 15.0},
    {"type": "blocked", "rank": 0, "seconds": 0.5, "t": 18.0},
    {"type": "session_end", "t": 20.0},
]

CRASH_LOOP: list[Record] = [
    {"type": "session_start", "t": 0.0},
    {"type": "attempt_start", "attempt": 0, "t": 0.0},
    {"type": "train_start", "attempt": 0, "t": 1.0},
    {"type": "commit", "index": 1, "t": 3.0},
    {"type": "failure", "attempt": 0, "t": 4.0, "ranks": [0], "last_commit_t": 3.0},
    # Three attempts that die before training: recovery all along, no work lost.
    {"type": "attempt_start", "attempt": 1, "t": 5.0},
    {"type": "failure", "attempt": 1, "t": 6.0, "ranks": [0], "last_commit_t": 5.0},
    {"type": "attempt_start", "attempt": 2, "t": 7.0},
    {"type": "failure", "attempt": 2, "t": 9.0, "ranks": [0], "last_commit_t": 7.0},
    {"type": "attempt_start", "attempt": 3, "t": 9.5},
    {"type": "workers_ready", "attempt": 3, "t": 10.0},
    {"type": "failure", "attempt": 3, "t": 11.0, "ranks": [0], "last_commit_t": 9.5},
    {"type": "attempt_start", "attempt": 4, "t": 12.0},
    {"type": "train_start", "attempt": 4, "t": 13.0},
    {"type": "session_end", "t": 20.0},
]

DRIVER_DIED_THEN_AN_OLD_STYLE_FAILURE: list[Record] = [
    {"type": "session_start", "t": 0.0},
    {"type": "attempt_start", "attempt": 0, "t": 0.0},
    {"type": "first_report", "attempt": 0, "t": 1.0},
    {"type": "commit", "index": 1, "t": 3.0},
    {"type": "blocked", "rank": 0, "seconds": 0.5, "t": 3.5},
    {"type": "session_start", "t": 10.0},
    {"type": "attempt_start", "attempt": 1, "t": 10.0},
    {"type": "train_start", "attempt": 1, "t": 12.0},
    {"type": "blocked", "rank": 0, "seconds": 1.0, "t": 14.0},
    # A log written before last_commit_t: the attempt's start instead.
    {"type": "failure", "attempt": 1, "t": 15.0, "ranks": [0], "attempt_t": 10.0},
    {"type": "attempt_start", "attempt": 2, "t": 15.5},
    {"type": "session_end", "t": 16.0},
]


def test_a_failure_before_the_first_commit_does_not_count_start_up_again() -> None:
    summary = summarize(FAILED_BEFORE_ITS_FIRST_COMMIT)
    assert summary.wall_s == 200.0
    assert summary.startup_s == 10.0
    assert summary.recovery_s == 10.0  # from the failure to the next train start
    assert summary.lost_work_s == 90.0  # from the train start, not the attempt's start
    assert summary.productive_s == pytest.approx(90.0)
    assert summary.goodput == pytest.approx(0.45)


def test_a_stall_after_the_last_commit_is_lost_work_only() -> None:
    summary = summarize(STALLS_AFTER_THE_LAST_COMMIT)
    assert summary.lost_work_s == 6.0
    # 1 s, the 1 s of the second stall before the commit, and 0.5 s in attempt 1.
    assert summary.checkpoint_blocked_s == pytest.approx(2.5)
    assert (summary.startup_s, summary.recovery_s) == (2.0, 3.0)
    assert summary.productive_s == pytest.approx(20.0 - 2.0 - 3.0 - 6.0 - 2.5)


def test_a_crash_loop_is_recovery_not_lost_work() -> None:
    summary = summarize(CRASH_LOOP)
    assert summary.recovery_s == pytest.approx(9.0)  # 4 to 13
    assert summary.lost_work_s == pytest.approx(1.0)  # 3 to 4
    assert summary.productive_s == pytest.approx(20.0 - 1.0 - 9.0 - 1.0)
    assert (summary.attempts, summary.failures) == (5, 4)


def _timeline_seconds(timeline: Timeline) -> dict[str, float]:
    """Each category's seconds over the lanes of the one rank (or of no rank)."""
    lanes = [lane for lane in timeline.lanes if lane.rank in (0, None)]
    assert len({lane.attempt for lane in lanes}) == len(lanes)
    return {category: sum(lane.seconds(category) for lane in lanes)
            for category in CATEGORIES}


def _assert_agree(events: list[Record]) -> GoodputSummary:
    summary = summarize(events)
    seconds = _timeline_seconds(build_timeline(events))
    # The attempts cover the sessions, so the lanes hold all the wall time.
    assert sum(seconds.values()) == pytest.approx(summary.wall_s)
    assert seconds["startup"] == pytest.approx(summary.startup_s)
    assert seconds["recovery"] == pytest.approx(summary.recovery_s)
    assert seconds["lost_work"] == pytest.approx(summary.lost_work_s)
    assert seconds["checkpoint_stall"] == pytest.approx(summary.checkpoint_blocked_s)
    assert seconds["training"] == pytest.approx(summary.productive_s)
    return summary


@pytest.mark.parametrize("events", [
    FAILED_BEFORE_ITS_FIRST_COMMIT, STALLS_AFTER_THE_LAST_COMMIT, CRASH_LOOP,
    DRIVER_DIED_THEN_AN_OLD_STYLE_FAILURE,
], ids=["failed-before-a-commit", "stalls-after-the-last-commit", "crash-loop",
        "driver-died-old-failure"])
def test_the_summary_and_the_timeline_of_one_rank_agree(events: list[Record]) -> None:
    _assert_agree(events)


def _random_run(rng: random.Random) -> list[Record]:
    """One driver, one rank: attempts that may die before training, before or after a
    commit, with stalls of the rank while it trains."""
    t = 0.0
    events: list[Record] = [{"type": "session_start", "t": t}]
    attempts = rng.randint(1, 6)
    for attempt in range(attempts):
        start = t
        events.append({"type": "attempt_start", "attempt": attempt, "t": start})
        t += rng.uniform(0.5, 3.0)
        last_commit = start
        if rng.random() < 0.8:
            events.append({"type": "train_start", "attempt": attempt, "t": t})
            for _ in range(rng.randint(0, 5)):
                t += rng.uniform(0.1, 2.0)
                if rng.random() < 0.5:
                    seconds = rng.uniform(0.0, 1.5)
                    t += seconds
                    events.append({"type": "blocked", "rank": 0, "seconds": seconds, "t": t})
                if rng.random() < 0.4:
                    last_commit = t
                    events.append({"type": "commit", "index": len(events), "t": t})
        t += rng.uniform(0.1, 3.0)
        if attempt < attempts - 1:
            events.append({"type": "failure", "attempt": attempt, "t": t, "ranks": [0],
                           "reason": "x", "last_commit_t": last_commit})
            t += rng.uniform(0.0, 1.0)
    events.append({"type": "session_end", "t": t})
    rng.shuffle(events)
    return events


@pytest.mark.parametrize("seed", range(40))
def test_the_summary_and_the_timeline_agree_on_random_runs(seed: int) -> None:
    _assert_agree(_random_run(random.Random(seed)))


def _many_lanes() -> list[Record]:
    """~100 KB of a crash-looping or forged log: 5,000 attempts, one rank 4095."""
    events: list[Record] = [{"type": "session_start", "t": 0.0}]
    events += [{"type": "attempt_start", "attempt": n, "t": float(n)} for n in range(5000)]
    events.append({"type": "blocked", "rank": 4095, "seconds": 0.5, "t": 5000.0})
    return events


def test_many_attempts_times_many_ranks_build_a_bounded_number_of_lanes() -> None:
    events = _many_lanes()
    timeline = build_timeline(events)
    cap = timeline_module._MAX_LANES
    assert 0 < len(timeline.lanes) <= cap
    assert timeline.lane_count == 5000 * 4096
    assert timeline.lanes_left_out == 5000 * 4096 - len(timeline.lanes)
    assert timeline.as_dict()["lane_count"] == 5000 * 4096
    # The first lanes are built: attempt 0's ranks in order.
    assert [(lane.attempt, lane.rank) for lane in timeline.lanes[:3]] == [(0, 0), (0, 1),
                                                                         (0, 2)]
    assert summarize(events).attempts == 5000


def test_a_small_run_builds_all_its_lanes() -> None:
    timeline = build_timeline(STALLS_AFTER_THE_LAST_COMMIT)
    assert len(timeline.lanes) == timeline.lane_count == 2
    assert timeline.lanes_left_out == 0
    assert build_timeline([]).lane_count == 0


def test_the_goodput_command_charts_a_log_of_many_lanes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    run = tmp_path / "run"
    (run / EVENTS_DIR).mkdir(parents=True)
    (run / INDEX_NAME).write_text(json.dumps({"version": 1, "checkpoints": []}))
    (run / EVENTS_DIR / "segment_000000.jsonl").write_text(
        "".join(json.dumps(event) + "\n" for event in _many_lanes()))
    chart = tmp_path / "goodput.png"
    assert main(["goodput", str(run), "-o", str(chart), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["attempts"] == 5000.0
    assert chart.read_bytes().startswith(b"\x89PNG")
