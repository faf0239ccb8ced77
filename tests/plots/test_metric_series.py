"""What ``cairn plot`` draws, from hand-made metrics records and events (pure logic)."""

from __future__ import annotations

from typing import Any

import pytest

from cairn._src.errors import ConfigError
from cairn._src.plots.series import build_plot, numeric_metrics


def record(report: int, attempt: int, step: int, time: float, dir_name: str | None = None,
           **metrics: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"report_index": report, "attempt": attempt, "time": time,
                           "metrics": {"step": step, "loss": 1.0 / (step + 1), **metrics}}
    if dir_name:
        out["checkpoint_dir_name"] = dir_name
    return out


RECORDS = [
    record(1, 0, 0, 101.0), record(2, 0, 1, 102.0, "checkpoint_000002"),
    record(3, 0, 2, 103.0), record(4, 0, 3, 104.0, "checkpoint_000004"),
    # The restart resumes from report 2 (step 1): steps 2 and 3 are redone.
    record(5, 1, 2, 108.0), record(6, 1, 3, 109.0, "checkpoint_000006"), record(7, 1, 4, 110.0),
]
EVENTS = [
    {"type": "session_start", "t": 100.0},
    {"type": "attempt_start", "attempt": 0, "t": 100.0, "resume": None},
    {"type": "commit", "index": 2, "t": 102.5},
    {"type": "failure", "attempt": 0, "t": 105.0, "ranks": [1], "reason": "[rank 1] boom",
     "errors": [{"type": "RuntimeError", "ranks": [1], "message": "boom"}]},
    {"type": "attempt_start", "attempt": 1, "t": 106.0, "resume": "checkpoint_000002"},
    {"type": "commit", "index": 6, "t": 109.5},
    {"type": "session_end", "t": 111.0, "status": "finished"},
]
KEPT = {"checkpoint_000006": 6}


def test_each_attempt_is_its_own_series() -> None:
    plot = build_plot("demo", RECORDS, EVENTS, KEPT, ["loss"])
    first, second = plot.series_of("loss")
    assert (first.attempt, first.report, first.x) == (0, (1, 2, 3, 4), (1.0, 2.0, 3.0, 4.0))
    assert (second.attempt, second.report) == (1, (5, 6, 7))
    assert second.y == (1 / 3, 1 / 4, 1 / 5)


def test_checkpoints_are_kept_deleted_or_never_committed() -> None:
    plot = build_plot("demo", RECORDS, EVENTS, KEPT, ["loss"])
    assert [(c.dir_name, c.report, c.attempt, c.status) for c in plot.checkpoints] == [
        ("checkpoint_000002", 2, 0, "deleted"), ("checkpoint_000004", 4, 0, "uncommitted"),
        ("checkpoint_000006", 6, 1, "kept")]


@pytest.mark.parametrize(("x_axis", "restart_x", "xs"), [
    ("report", 4.5, (5.0, 6.0, 7.0)),
    ("step", 2.0, (2.0, 3.0, 4.0)),  # where the next attempt resumed
    ("time", 5.0, (8.0, 9.0, 10.0)),  # the failure, in seconds since the run started
])
def test_restarts_are_placed_on_each_x_axis(x_axis: str, restart_x: float,
                                            xs: tuple[float, ...]) -> None:
    plot = build_plot("demo", RECORDS, EVENTS, KEPT, ["loss"], x_axis)
    (restart,) = plot.restarts
    assert restart.x == restart_x and restart.t == 5.0
    assert plot.series_of("loss")[1].x == xs
    assert (restart.attempt, restart.label, restart.restarted) == (0, "rank 1: RuntimeError",
                                                                  True)
    assert (restart.resumed_from, restart.resumed_from_report) == ("checkpoint_000002", 2)
    assert plot.lost_from(0) == 2 and plot.lost_from(1) is None
    assert restart.counted is True


def test_a_final_failure_redoes_nothing_and_a_fresh_restart_redoes_everything() -> None:
    final = build_plot("demo", RECORDS[:4], EVENTS[:4], {}, ["loss"])
    assert final.restarts[0].restarted is False and final.lost_from(0) is None
    assert final.restarts[0].x == 4.5
    scratch = [*EVENTS[:3], {**EVENTS[3], "counted": False},
               {"type": "attempt_start", "attempt": 1, "t": 106.0, "resume": None}]
    plot = build_plot("demo", RECORDS, scratch, {}, ["loss"])
    assert plot.lost_from(0) == 0 and plot.restarts[0].counted is False


def test_json_document() -> None:
    document = build_plot("demo", RECORDS, EVENTS, KEPT, ["loss", "step"], "step").as_dict()
    assert document["version"] == 1 and document["run"] == "demo" and document["x"] == "step"
    assert document["log"] is False
    assert document["metrics"] == ["loss", "step"] and document["started_at"] == 100.0
    assert len(document["series"]) == 4
    assert document["restarts"][0]["errors"] == [
        {"type": "RuntimeError", "ranks": [1], "message": "boom"}]


def test_unknown_metric_names_the_ones_the_run_has() -> None:
    with pytest.raises(ConfigError, match=r"--metric='acc' is not a numeric metric of this "
                                          r"run; metrics: \['loss', 'step'\]"):
        build_plot("demo", RECORDS, EVENTS, KEPT, ["loss", "acc"])


def test_x_step_needs_a_step_metric() -> None:
    records = [{"report_index": 1, "metrics": {"loss": 1.0}}]
    with pytest.raises(ConfigError, match=r"--x step needs a numeric 'step' metric in the "
                                          r"run's reports; metrics: \['loss'\]"):
        build_plot("demo", records, [], {}, ["loss"], "step")
    with pytest.raises(ConfigError, match=r"--x='epoch' is not one of 'report', 'step', 'time'"):
        build_plot("demo", records, [], {}, ["loss"], "epoch")


def test_log_scale_needs_positive_values() -> None:
    records = [{"report_index": 1, "metrics": {"delta": -0.5}},
               {"report_index": 2, "metrics": {"delta": 2.0}}]
    with pytest.raises(ConfigError, match=r"--log needs values > 0, and --metric='delta' has "
                                          r"-0.5; drop --log for this metric"):
        build_plot("demo", records, [], {}, ["delta"], log=True)


def test_untrusted_records_are_skipped() -> None:
    records: list[Any] = [
        {"report_index": "3", "metrics": {"loss": 1.0}},
        {"report_index": 1, "metrics": "loss"},
        {"report_index": 2, "metrics": {"loss": True}},
        {"report_index": 3, "metrics": {"loss": float("nan")}},
        {"report_index": 4, "metrics": {"loss": "low", "other": [1]}},
        {"report_index": 5, "metrics": {"loss": 0.5}, "checkpoint_dir_name": 7},
        {"report_index": 6, "time": "noon", "metrics": {"loss": 0.25}},
    ]
    assert numeric_metrics(records) == ["loss"]
    plot = build_plot("demo", records, ["junk", {"type": "failure", "t": "x"}], {}, ["loss"],
                      "time")
    # No record has a valid time: nothing to place on a time axis.
    assert plot.series_of("loss") == [] and plot.started_at is None
    assert plot.checkpoints == () and plot.restarts == ()
    plot = build_plot("demo", records, [], {}, ["loss"])
    assert plot.series_of("loss")[0].report == (5, 6)


def test_records_without_an_attempt_belong_to_the_attempt_started_by_then() -> None:
    records = [{"report_index": 1, "time": 101.0, "metrics": {"loss": 1.0}},
               {"report_index": 2, "time": 107.0, "metrics": {"loss": 0.5}}]
    plot = build_plot("demo", records, EVENTS, {}, ["loss"])
    assert [s.attempt for s in plot.series_of("loss")] == [0, 1]


def test_the_rank_that_died_comes_before_the_knock_on_error() -> None:
    # Rank 1 was killed; rank 0 then lost its gloo peer. The event's ranks name the cause
    # first, its errors are by rank (as runs written before the fix have them).
    failure = {"type": "failure", "attempt": 0, "t": 105.0, "ranks": [1, 0],
               "reason": "[rank 1] Worker rank 1 (pid 9) was killed by SIGKILL (and 1 more)",
               "errors": [{"type": "RuntimeError", "ranks": [0],
                           "message": "[../gloo/transport/tcp/pair.cc] Connection closed by peer"},
                          {"type": "cairn.WorkerProcessError", "ranks": [1],
                           "message": "Worker rank 1 (pid 9) was killed by SIGKILL"}]}
    events = [failure if e["type"] == "failure" else e for e in EVENTS]
    restart = build_plot("demo", RECORDS, events, KEPT, ["loss"], "step").restarts[0]
    assert restart.label == "rank 1: WorkerProcessError; rank 0: RuntimeError"
    assert restart.detail.startswith(
        "rank 1: WorkerProcessError; rank 0: RuntimeError (Worker rank 1 (pid 9) was killed")
    assert [e.ranks for e in restart.errors] == [(1,), (0,)]
