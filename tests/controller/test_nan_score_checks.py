"""NaN as checkpoint_score_attribute: accepted where reports and validations are checked,
ranked as the worst in both orders (as Ray Train's checkpoint manager ranks it, below
-inf too), the same after the index's JSON round trip, and warned of once per run.
Pure logic: the tracker, the checks and the ranking, without processes (the real runs are
in tests/checkpoint/test_nan_score.py)."""

from __future__ import annotations

import logging
import math
import time

import pytest

from cairn import ReportError
from cairn._src.checkpoint.index import CheckpointRecord, RunIndex
from cairn._src.checkpoint.retention import KeepBest, ray_order
from cairn._src.controller.reports import NanScoreWarning, ReportTracker
from cairn._src.run.report_checks import (
    check_merged_score,
    check_score_attribute,
    is_nan_score,
)
from cairn._src.storage.transfer import FileEntry
from cairn._src.wire.messages import CheckpointIntent, ReportMessage, UploadedMessage

NAN = float("nan")
INF = float("inf")


def test_a_nan_score_is_accepted_and_what_is_no_number_is_still_refused() -> None:
    check_score_attribute({"loss": NAN}, "loss")
    check_score_attribute({"val": {"loss": NAN}}, "val/loss")
    check_score_attribute({"loss": -INF}, "loss")
    with pytest.raises(ReportError, match=r"^report\(metrics=\.\.\.\) has 'loss'='high'; the "
                       r"checkpoint_score_attribute must be a number \(an int or a float, "
                       r"NaN included\), not str\.$"):
        check_score_attribute({"loss": "high"}, "loss")
    with pytest.raises(ReportError, match=r"has 'loss'=True; .* not bool\.$"):
        check_score_attribute({"loss": True}, "loss")
    with pytest.raises(ReportError, match=r"within a double's range"):
        check_score_attribute({"loss": 10**400}, "loss")
    with pytest.raises(ReportError, match=r"has no 'loss', the checkpoint_score_attribute"):
        check_score_attribute({"acc": 1.0}, "loss")
    with pytest.raises(ReportError, match=r"has no 'loss'"):
        check_score_attribute({"loss": None}, "loss")
    assert is_nan_score({"loss": NAN}, "loss")
    assert not is_nan_score({"loss": 1.0}, "loss") and not is_nan_score({"loss": NAN}, None)
    assert not is_nan_score({"loss": "nan"}, "loss")


def test_a_validation_giving_a_nan_score_merges() -> None:
    # NaN != NaN: the merged score must still be recognised as the one the validation gave.
    check_merged_score({"loss": 2.0}, {"loss": NAN}, "loss", what="v")
    check_merged_score({"val": {"loss": 2.0}}, {"val": {"loss": NAN}}, "val/loss", what="v")
    with pytest.raises(ReportError, match=r"have the flat key 'val/loss'"):
        # Reported flat, validated nested: retention would read the reported NaN.
        check_merged_score({"val/loss": float("nan")}, {"val": {"loss": float("nan")}},
                           "val/loss", what="v")


def _report(rank: int, index: int, loss: float, *, checkpoint: bool = True) -> ReportMessage:
    intent = (CheckpointIntent(f"checkpoint_{index:06d}", "SYNC", files={"m": 1})
              if checkpoint else None)
    return ReportMessage(rank, index, {"loss": loss}, intent, time.time())


def _commit(tracker: ReportTracker, index: int, loss: float, *, world: int = 1) -> list[str]:
    """Report ``index`` with ``loss`` on every rank, the checkpoint on the last one; the
    names of the checkpoints ready to commit."""
    for rank in range(world):
        tracker.on_report(_report(rank, index, loss, checkpoint=rank == world - 1))
    tracker.on_uploaded(UploadedMessage(world - 1, index, {"m": FileEntry(1, "sum")}, None,
                                        1, 0.1))
    assert tracker.take_refused() == []
    return [ready.dir_name for ready in tracker.take_ready()]


def _nan_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "is NaN" in r.getMessage()]


def test_a_nan_score_on_rank_0_commits_with_one_warning_per_run(
        caplog: pytest.LogCaptureFixture) -> None:
    shared = NanScoreWarning()
    first = ReportTracker(2, used_dir_names=set(), score_attribute="loss", nan_warning=shared)
    with caplog.at_level(logging.WARNING, logger="cairn"):
        # Rank 0's metrics (NaN) are the checkpoint's; rank 1 passes the checkpoint.
        assert _commit(first, 1, 3.0, world=2) == ["checkpoint_000001"]
        assert _commit(first, 2, NAN, world=2) == ["checkpoint_000002"]
        assert _commit(first, 3, NAN, world=2) == ["checkpoint_000003"]
        # The next attempt's tracker shares the run's warning: no second one.
        second = ReportTracker(1, used_dir_names=set(), score_attribute="loss",
                               nan_warning=shared, first_index=4)
        assert _commit(second, 4, NAN) == ["checkpoint_000004"]
    [warning] = _nan_warnings(caplog)
    assert warning.startswith("The checkpoint_score_attribute 'loss' of checkpoint_000002 "
                              "(report 2) is NaN: the checkpoint is committed and ranks as "
                              "the worst")


def test_without_a_score_attribute_nan_is_a_metric_like_any() -> None:
    tracker = ReportTracker(1, used_dir_names=set())
    assert _commit(tracker, 1, NAN) == ["checkpoint_000001"]


def _record(index: int, loss: float) -> CheckpointRecord:
    return CheckpointRecord(dir_name=f"c{index}", report_index=index, metrics={"loss": loss})


@pytest.mark.parametrize("order", ["min", "max"])
def test_nan_ranks_below_every_number_before_and_after_the_index_round_trip(
        order: str) -> None:
    records = (_record(1, NAN), _record(2, -INF), _record(3, 1.0), _record(4, NAN),
               _record(5, INF))
    read_back = RunIndex(checkpoints=records).to_json()
    assert b"NaN" in read_back and b"-Infinity" in read_back
    again = RunIndex.from_json(read_back, where="the test's index").checkpoints
    assert math.isnan(again[0].metrics["loss"]) and again[1].metrics["loss"] == -INF
    for ranked in (records, again):
        # Ray's order, worst to best: the NaNs first (the earlier report first), then the
        # numbers; -inf is the best loss and the worst accuracy.
        numbers = ["c5", "c3", "c2"] if order == "min" else ["c2", "c3", "c5"]
        assert [r.dir_name for r in ray_order(list(ranked), "loss", order)] == [
            "c1", "c4", *numbers]
        # num_to_keep drops the NaNs first, the earlier one first.
        keep = KeepBest(3, "loss", order)  # type: ignore[arg-type]
        assert keep.should_keep(ranked) == [False, True, True, False, True]
        keep = KeepBest(4, "loss", order)  # type: ignore[arg-type]
        assert keep.should_keep(ranked) == [False, True, True, True, True]
