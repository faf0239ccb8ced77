from __future__ import annotations

from cairn._src.checkpoint.index import CheckpointRecord
from cairn._src.checkpoint.retention import (
    KeepAll,
    KeepBest,
    KeepLatest,
    best_first,
    decide_retention,
    make_policy,
)


def record(index: int, **metrics: float) -> CheckpointRecord:
    return CheckpointRecord(dir_name=f"checkpoint_{index:06d}", report_index=index,
                            metrics=dict(metrics))


def test_keep_latest_keeps_highest_report_indices() -> None:
    records = [record(1), record(3), record(2)]
    assert KeepLatest(2).should_keep(records) == [False, True, True]


def test_keep_best_max_and_min() -> None:
    records = [record(1, acc=0.5), record(2, acc=0.9), record(3, acc=0.7)]
    assert KeepBest(1, "acc", "max").should_keep(records) == [False, True, False]
    assert KeepBest(1, "acc", "min").should_keep(records) == [True, False, False]


def test_keep_best_ranks_missing_scores_last_in_both_orders() -> None:
    records = [record(1), record(2, loss=3.0)]
    assert KeepBest(1, "loss", "min").should_keep(records) == [False, True]
    assert KeepBest(1, "loss", "max").should_keep(records) == [False, True]


def test_an_infinite_score_is_a_score_in_both_orders() -> None:
    # -inf is the best loss there is (and the worst accuracy); it never ranks as missing.
    inf = float("inf")
    records = [record(1, loss=-inf), record(2, loss=3.0), record(3)]
    assert KeepBest(1, "loss", "min").should_keep(records) == [True, False, False]
    assert KeepBest(2, "loss", "max").should_keep(records) == [True, True, False]
    records = [record(1, acc=inf), record(2, acc=0.9), record(3)]
    assert KeepBest(1, "acc", "max").should_keep(records) == [True, False, False]
    assert KeepBest(2, "acc", "min").should_keep(records) == [True, True, False]


def test_a_score_no_double_holds_ranks_last_instead_of_raising() -> None:
    # Read back from an index: report() refuses it, a planted one must not stop retention.
    records = [record(1, loss=10**400), record(2, loss=3.0), record(3, loss=5.0)]
    assert KeepBest(1, "loss", "min").should_keep(records) == [False, True, False]
    assert KeepBest(1, "loss", "max").should_keep(records) == [False, False, True]


def test_latest_and_protected_are_always_kept() -> None:
    records = [record(1, loss=0.1), record(2, loss=0.5), record(3, loss=0.9)]
    policy = KeepBest(1, "loss", "min")
    keep = decide_retention(policy, records, protected=["checkpoint_000002"])
    assert keep == [True, True, True]
    keep = decide_retention(policy, records, protected=[None])
    assert keep == [True, False, True]


def test_make_policy_and_best_first() -> None:
    assert isinstance(make_policy(None, None, "max"), KeepAll)
    assert isinstance(make_policy(2, None, "max"), KeepLatest)
    assert isinstance(make_policy(2, "acc", "max"), KeepBest)
    records = [record(1, acc=0.2), record(2, acc=0.8), record(3, acc=0.5)]
    assert [r.report_index for r in best_first(records, "acc", "max")] == [2, 3, 1]
    assert [r.report_index for r in best_first(records, None, "max")] == [3, 2, 1]


def test_nested_score_attribute() -> None:
    records = [CheckpointRecord(dir_name="a", report_index=1, metrics={"val": {"acc": 0.1}}),
               CheckpointRecord(dir_name="b", report_index=2, metrics={"val": {"acc": 0.9}})]
    assert KeepBest(1, "val/acc").should_keep(records) == [False, True]


def test_a_flat_score_key_with_a_slash_ranks_as_report_checked_it() -> None:
    # report() accepts {"val/loss": x} for checkpoint_score_attribute="val/loss" (the flat
    # key first, as Ray's flattened metrics are), so retention ranks by it too: the best
    # checkpoint is kept, not the latest one by default.
    records = [CheckpointRecord(dir_name=f"c{i}", report_index=i, metrics={"val/loss": loss})
               for i, loss in ((1, 0.1), (2, 0.9), (3, 0.5))]
    assert KeepBest(1, "val/loss", "min").should_keep(records) == [True, False, False]
    assert [r.dir_name for r in best_first(records, "val/loss", "min")] == ["c1", "c3", "c2"]
