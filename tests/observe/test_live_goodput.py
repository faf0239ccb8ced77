"""The live view's goodput agrees with the summary of the same events (``cairn goodput``):
a rank's stall in work an attempt then lost is counted once, as lost work."""

from __future__ import annotations

import pytest

from cairn._src.goodput.summary import summarize
from cairn._src.observe.live_state import LiveState
from cairn._src.run.events import (
    AttemptStart,
    Blocked,
    Commit,
    Event,
    Failure,
    SessionEnd,
    SessionStart,
    TrainStart,
)


def _both(ranks: int = 2) -> tuple[LiveState, list[Event]]:
    return LiveState(ranks, started_at=0.0), [SessionStart(t=0.0)]


def _attempt(state: LiveState, log: list[Event], number: int, at: float,
             trained: float) -> None:
    state.on_attempt_start(number, at, None)
    state.on_train_start(trained)
    log += [AttemptStart(t=at, attempt=number), TrainStart(t=trained)]


def _stall(state: LiveState, log: list[Event], rank: int, start: float, end: float) -> None:
    state.on_blocked(rank, end - start, end)
    log.append(Blocked(t=end, rank=rank, seconds=end - start))


def _commit(state: LiveState, log: list[Event], index: int, at: float) -> None:
    state.on_committed(index, f"checkpoint_{index:06d}", 0, 0.1, at, False)
    log.append(Commit(t=at, index=index, bytes=0))


def _fail(state: LiveState, log: list[Event], number: int, at: float,
          last_commit: float) -> None:
    state.on_failure(number, at, "rank 1 exited", last_commit, True)
    log.append(Failure(t=at, attempt=number, last_commit_t=last_commit))


def test_a_stall_in_lost_work_is_lost_work_not_a_stall_too() -> None:
    state, log = _both()
    _attempt(state, log, 0, 0.0, 5.0)
    _stall(state, log, 0, 10.0, 14.0)  # before the commit: a stall
    _commit(state, log, 1, 15.0)
    _stall(state, log, 0, 20.0, 28.0)  # after it: lost when the attempt fails
    _stall(state, log, 1, 21.0, 23.0)
    _fail(state, log, 0, 30.0, 15.0)
    _attempt(state, log, 1, 31.0, 35.0)
    _stall(state, log, 1, 40.0, 43.0)  # the running attempt's: a stall
    live = state.goodput(50.0)
    logged = summarize([*log, SessionEnd(t=50.0)])
    assert live.checkpoint_blocked_s == pytest.approx(logged.checkpoint_blocked_s)
    assert live.checkpoint_blocked_s == pytest.approx(4.0 + 3.0)
    assert live.lost_work_s == pytest.approx(logged.lost_work_s) == pytest.approx(15.0)
    assert live.productive_s == pytest.approx(logged.productive_s)


def test_a_stall_that_ends_after_a_commit_keeps_its_part_before_it() -> None:
    state, log = _both(1)
    _attempt(state, log, 0, 0.0, 1.0)
    _commit(state, log, 1, 10.0)
    _stall(state, log, 0, 8.0, 12.0)  # reported after the commit it waited for
    _fail(state, log, 0, 20.0, 10.0)
    live = state.goodput(20.0)
    logged = summarize([*log, SessionEnd(t=20.0)])
    assert live.checkpoint_blocked_s == pytest.approx(logged.checkpoint_blocked_s)
    assert live.checkpoint_blocked_s == pytest.approx(2.0)


def test_a_long_run_of_stalls_across_commits_agrees_with_the_summary() -> None:
    # Hundreds of commits: the live view folds its stretches together now and then, not
    # at every commit, and still counts what the summary counts (overlapping ranks once,
    # a stall that began before the last commit included).
    state, log = _both(ranks=3)
    _attempt(state, log, 0, 0.0, 0.5)
    t = 1.0
    for index in range(1, 400):
        for rank in range(3):
            _stall(state, log, rank, t - 0.3 + 0.1 * rank, t + 0.2 + 0.05 * rank)
        _commit(state, log, index, t + 0.1)
        t += 1.0
    _fail(state, log, 0, t, t - 0.9)
    live = state.goodput(t + 1.0)
    logged = summarize([*log, SessionEnd(t=t + 1.0)])
    assert live.checkpoint_blocked_s == pytest.approx(logged.checkpoint_blocked_s)
    assert live.lost_work_s == pytest.approx(logged.lost_work_s)
