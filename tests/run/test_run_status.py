"""How a run's event log folds into its status, failures and error (pure logic)."""

from __future__ import annotations

from typing import Any

import pytest

from cairn._src.run.status import run_history
from cairn._src.text import plural


def session(*events: dict[str, Any], end: dict[str, Any] | None = None,
            t0: float = 100.0) -> list[dict[str, Any]]:
    out = [{"type": "session_start", "t": t0}, *events]
    if end is not None:
        out.append({"type": "session_end", "t": t0 + 50, **end})
    return out


def test_a_finished_run() -> None:
    history = run_history(session({"type": "attempt_start", "attempt": 0, "t": 101},
                                  end={"status": "finished"}))
    assert (history.status, history.attempts, history.failures, history.error) == (
        "finished", 1, (), None)


def test_a_failed_run_carries_its_error_and_each_failure() -> None:
    failure = {"type": "failure", "attempt": 0, "t": 110.0, "ranks": [1],
               "reason": "rank 1 raised ValueError: boom",
               "errors": [{"type": "ValueError", "ranks": [1], "message": "boom"}]}
    error = {"type": "cairn.WorkerGroupError", "ranks": [1], "message": "Training failed"}
    history = run_history(session({"type": "attempt_start", "attempt": 0, "t": 101}, failure,
                                  end={"status": "failed", "error": error}))
    assert history.status == "failed"
    assert history.error is not None
    assert (history.error.type, history.error.rank) == ("cairn.WorkerGroupError", 1)
    [seen] = history.failures
    assert (seen.attempt, seen.t, seen.ranks, seen.reason) == (0, 110.0, (1,), failure["reason"])
    assert seen.errors[0].message == "boom"


def test_a_driver_that_died_leaves_an_interrupted_run_unless_a_driver_is_live() -> None:
    events = session({"type": "attempt_start", "attempt": 0, "t": 101})
    assert run_history(events).status == "interrupted"
    assert run_history(events, driver_live=True).status == "running"
    # A later driver that finished the run: finished.
    events += session({"type": "attempt_start", "attempt": 1, "t": 201},
                      end={"status": "finished"}, t0=200)
    history = run_history(events)
    assert (history.status, history.sessions, history.attempts) == ("finished", 2, 2)
    assert history.restarts_at == (201,)


def test_ctrl_c_is_interrupted_and_no_events_is_new() -> None:
    assert run_history(session(end={"status": "interrupted"})).status == "interrupted"
    assert run_history([]).status == "new"


def test_logs_from_before_session_end_said_how_it_went() -> None:
    failure = {"type": "failure", "attempt": 0, "t": 110.0, "ranks": [0], "reason": "died"}
    history = run_history(session({"type": "attempt_start", "attempt": 0, "t": 101}, failure,
                                  end={}))
    assert history.status == "failed"
    assert history.error is not None and history.error.message == "died"
    restarted = session({"type": "attempt_start", "attempt": 0, "t": 101}, failure,
                        {"type": "attempt_start", "attempt": 1, "t": 120}, end={})
    assert run_history(restarted).status == "finished"


@pytest.mark.parametrize("junk", [
    [1, "x", None],
    [{"type": "failure", "t": "soon", "ranks": "all", "errors": {"a": 1}, "attempt": True}],
    [{"type": "session_end", "status": 7, "error": ["x"]}],
    [{"type": "failure", "errors": [{"type": 1, "message": None}, "x"], "ranks": [True, 2]}],
])
def test_events_of_the_wrong_types_are_skipped_not_trusted(junk: list[Any]) -> None:
    history = run_history([{"type": "session_start", "t": 1.0}, *junk])
    assert history.status in ("interrupted", "finished", "failed")
    for failure in history.failures:
        assert all(type(r) is int for r in failure.ranks)
        assert failure.attempt is None or type(failure.attempt) is int
        assert failure.t is None or isinstance(failure.t, float)


def test_plural() -> None:
    assert [plural(n, "file") for n in (0, 1, 2)] == ["0 files", "1 file", "2 files"]
    assert plural(1, "attempt") == "1 attempt"
    assert plural(3, "child", "children") == "3 children"
