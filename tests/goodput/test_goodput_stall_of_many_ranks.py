"""The summary's checkpoint stall is the job's: the wall time during which at least one
rank was blocked in ``report()`` (the other ranks wait for it at their next collective),
which is the time some lane of the timeline shows as a stall. Not a mean over the ranks
that blocked, which gave half a stall to a job whose two ranks each blocked once."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from cairn._src.cli.main import main
from cairn._src.goodput.summary import summarize
from cairn._src.goodput.timeline import build_timeline
from cairn._src.run.layout import EVENTS_DIR, INDEX_NAME

Record = dict[str, Any]


def _run(*blocked: tuple[int, float, float]) -> list[Record]:
    """One attempt of two ranks training from 1 s to 20 s; ``blocked``: (rank, seconds,
    until)."""
    return [
        {"type": "session_start", "t": 0.0},
        {"type": "attempt_start", "attempt": 0, "t": 0.0},
        {"type": "train_start", "attempt": 0, "t": 1.0},
        *({"type": "blocked", "rank": rank, "kind": "checkpoint_stall", "seconds": seconds,
           "t": until} for rank, seconds, until in blocked),
        {"type": "session_end", "t": 20.0, "status": "finished"},
    ]


def _stall_on_the_chart(events: list[Record]) -> float:
    """The seconds during which some lane of the timeline shows a stall."""
    pieces = sorted((interval.start, interval.end)
                    for lane in build_timeline(events).lanes for interval in lane.intervals
                    if interval.category == "checkpoint_stall")
    covered, reached = 0.0, float("-inf")
    for start, end in pieces:
        if end > reached:
            covered += end - max(start, reached)
            reached = end
    return covered


def test_only_rank_0_saving_stalls_the_job_for_its_whole_stall() -> None:
    events = _run((0, 0.25, 3.0), (0, 0.5, 6.0), (0, 0.5, 9.0))
    assert summarize(events).checkpoint_blocked_s == pytest.approx(1.25)


def test_ranks_blocked_at_the_same_report_stall_the_job_as_the_slowest() -> None:
    events = _run((0, 1.0, 4.0), (1, 0.5, 3.6))
    summary = summarize(events)
    assert summary.checkpoint_blocked_s == pytest.approx(1.0)  # not the mean, 0.75
    assert summary.productive_s == pytest.approx(20.0 - 1.0 - 1.0)


def test_ranks_blocked_at_different_reports_each_stall_the_job() -> None:
    events = _run((0, 1.0, 4.0), (1, 1.0, 8.0))
    assert summarize(events).checkpoint_blocked_s == pytest.approx(2.0)  # not 1.0


def _random_run(rng: random.Random) -> list[Record]:
    """Attempts of up to four ranks, each blocked now and then while the attempt trains,
    some failing after a commit."""
    t = 0.0
    events: list[Record] = [{"type": "session_start", "t": t}]
    attempts = rng.randint(1, 4)
    for attempt in range(attempts):
        start = t
        events.append({"type": "attempt_start", "attempt": attempt, "t": start})
        t += rng.uniform(0.5, 2.0)
        events.append({"type": "train_start", "attempt": attempt, "t": t})
        last_commit = start
        for _ in range(rng.randint(0, 6)):
            t += rng.uniform(0.5, 2.0)
            for rank in rng.sample(range(4), rng.randint(0, 4)):
                events.append({"type": "blocked", "rank": rank, "t": t + rng.uniform(0, 0.5),
                               "seconds": rng.uniform(0.0, 1.5)})
            t += 0.5
            if rng.random() < 0.5:
                last_commit = t
                events.append({"type": "commit", "index": len(events), "t": t})
        t += rng.uniform(0.5, 2.0)
        if attempt < attempts - 1:
            events.append({"type": "failure", "attempt": attempt, "t": t, "ranks": [0],
                           "reason": "x", "last_commit_t": last_commit})
            t += rng.uniform(0.0, 1.0)
    events.append({"type": "session_end", "t": t})
    rng.shuffle(events)
    return events


@pytest.mark.parametrize("seed", range(30))
def test_the_stall_is_what_the_chart_shows_of_all_ranks(seed: int) -> None:
    events = _random_run(random.Random(seed))
    summary = summarize(events)
    assert summary.checkpoint_blocked_s == pytest.approx(_stall_on_the_chart(events))
    assert summary.productive_s >= 0.0


def test_the_goodput_command_reports_the_jobs_stall(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    (run / EVENTS_DIR).mkdir(parents=True)
    (run / INDEX_NAME).write_text(json.dumps({"version": 1, "checkpoints": []}))
    (run / EVENTS_DIR / "segment_000000.jsonl").write_text("".join(
        json.dumps(event) + "\n" for event in _run((0, 1.0, 4.0), (1, 0.5, 3.6))))
    assert main(["goodput", str(run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["checkpoint_blocked_s"] == pytest.approx(1.0)
