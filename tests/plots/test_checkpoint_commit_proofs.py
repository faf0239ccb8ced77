"""Which records prove a checkpoint was committed (pure logic over hand-made records): a
driver killed with ``kill -9`` loses its last, unflushed ``commit`` events, so ``cairn
plot`` takes a commit from every record that proves one."""

from __future__ import annotations

from typing import Any

import pytest

from cairn._src.plots.series import build_plot

RECORDS = [
    {"report_index": 1, "attempt": 0, "time": 101.0, "metrics": {"loss": 1.0},
     "checkpoint_dir_name": "checkpoint_000001"},
    {"report_index": 2, "attempt": 0, "time": 102.0, "metrics": {"loss": 0.5},
     "checkpoint_dir_name": "checkpoint_000002"},
]
START = [{"type": "session_start", "t": 100.0},
         {"type": "attempt_start", "attempt": 0, "t": 100.0, "resume": None}]


def removed(kind: str, **fields: Any) -> dict[str, Any]:
    return {"type": kind, "t": 110.0, "reason": "retention", **fields}


@pytest.mark.parametrize(("events", "resumed_from"), [
    ([{"type": "commit", "index": 2, "t": 102.5}], None),
    # The next driver resumed from it: its attempt_start, or the run index.
    ([{"type": "attempt_start", "attempt": 1, "t": 105.0, "resume": "checkpoint_000002"}],
     None),
    ([], "checkpoint_000002"),
    # Retention deleted it, or a resume dropped it as damaged: both only leave the index.
    ([removed("checkpoint_deleting", dir_name="checkpoint_000002", report_index=2)], None),
    ([removed("checkpoint_dropped", dir_name="checkpoint_000002", report_index=2)], None),
    ([removed("checkpoint_deleting", dir_name="checkpoint_000002")], None),
    ([removed("checkpoint_dropped", report_index=2)], None),
], ids=["commit", "resume", "index_resumed_from", "deleting", "dropped",
        "deleting_by_name", "dropped_by_report"])
def test_any_record_of_a_commit_makes_a_checkpoint_committed(
        events: list[dict[str, Any]], resumed_from: str | None) -> None:
    index: dict[str, Any] = {"resumed_from": resumed_from} if resumed_from else {}
    plot = build_plot("demo", RECORDS, [*START, *events], {}, ["loss"], **index)
    assert [(c.dir_name, c.status) for c in plot.checkpoints] == [
        ("checkpoint_000001", "uncommitted"), ("checkpoint_000002", "deleted")]
    assert plot.as_dict()["checkpoints"][1]["status"] == "deleted"


def test_a_checkpoint_no_record_proves_committed_stays_uncommitted() -> None:
    failure = {"type": "failure", "attempt": 0, "t": 103.0, "ranks": [0], "reason": "boom",
               "errors": []}
    others = [removed("checkpoint_deleting", dir_name="checkpoint_000009", report_index=9),
              removed("deletions_failed", dir_names=["checkpoint_000002"]),
              {"type": "attempt_start", "attempt": 1, "t": 105.0, "resume": None}]
    plot = build_plot("demo", RECORDS, [*START, failure, *others], {"checkpoint_000001": 1},
                      ["loss"])
    assert [c.status for c in plot.checkpoints] == ["kept", "uncommitted"]
