"""retention_reasons: why each checkpoint is kept, always the same decision as
decide_retention (what the driver and ``cairn prune`` act on)."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from cairn._src.checkpoint.index import CheckpointRecord, Retention
from cairn._src.checkpoint.retention import (
    KeepReason,
    decide_retention,
    make_policy,
    retention_reasons,
    score_of,
)
from cairn._src.controller.validations import ProtectPending


def record(index: int, **metrics: object) -> CheckpointRecord:
    return CheckpointRecord(dir_name=f"checkpoint_{index:06d}", report_index=index,
                            metrics=dict(metrics))


def codes(reasons: list[tuple[KeepReason, ...]]) -> list[list[str]]:
    return [[reason.code for reason in found] for found in reasons]


def test_best_n_by_score_then_the_latest_and_the_resumed_one() -> None:
    records = [record(1, loss=0.5), record(2, loss=0.1), record(3, loss=0.3),
               record(4, loss=0.9)]
    reasons = retention_reasons(records, Retention(2, "loss", "min"),
                                resumed_from="checkpoint_000001")
    assert codes(reasons) == [["resumed_from"], ["best"], ["best"], ["latest"]]
    assert reasons[1][0].text == "#1 of the best 2 by loss (min)"
    assert reasons[2][0].text == "#2 of the best 2 by loss (min)"
    assert reasons[3][0] == KeepReason("latest", "the latest checkpoint")
    assert reasons[0][0].text == "the run's last attempt resumed from it"


def test_max_order_ranks_the_highest_first() -> None:
    records = [record(1, acc=0.5), record(2, acc=0.9), record(3, acc=0.7)]
    reasons = retention_reasons(records, Retention(1, "acc", "max"))
    assert codes(reasons) == [[], ["best"], ["latest"]]
    assert reasons[1][0].text == "#1 of the best 1 by acc (max)"


def test_one_checkpoint_can_have_every_reason() -> None:
    records = [record(1, loss=0.5), record(2, loss=0.1)]
    reasons = retention_reasons(records, Retention(1, "loss", "min"),
                                resumed_from="checkpoint_000002")
    assert codes(reasons) == [[], ["best", "latest", "resumed_from"]]


def test_a_checkpoint_pending_validation_takes_no_best_place() -> None:
    # Its reported score may be replaced by the validation's: ranked, it could push the
    # validated best out for good (reported 9, validated 0 later).
    records = [record(1, score=5.0), record(2, score=9.0), record(3, score=1.0)]
    reasons = retention_reasons(records, Retention(1, "score", "max"),
                                pending={"checkpoint_000002", "checkpoint_000003"})
    assert codes(reasons) == [["best"], ["pending_validation"],
                              ["latest", "pending_validation"]]
    assert reasons[1][0].text == "its validation is pending"
    policy = ProtectPending(make_policy(1, "score", "max"),
                            lambda: {"checkpoint_000002", "checkpoint_000003"})
    assert decide_retention(policy, records) == [True, True, True]
    validated = [records[0], record(2, score=0.0), records[2]]
    assert decide_retention(make_policy(1, "score", "max"), validated) == [True, False, True]


def test_without_a_score_the_latest_n_are_kept() -> None:
    records = [record(3), record(1), record(2)]
    reasons = retention_reasons(records, Retention(2))
    assert codes(reasons) == [["latest_n", "latest"], [], ["latest_n"]]
    assert [r[0].text for r in reasons if r] == ["#1 of the latest 2", "#2 of the latest 2"]


def test_without_num_to_keep_everything_is_kept() -> None:
    reasons = retention_reasons([record(1), record(2)], Retention(None, "loss", "min"))
    assert codes(reasons) == [["all"], ["all", "latest"]]
    assert reasons[0][0].text == "every checkpoint is kept (no num_to_keep)"


def test_a_checkpoint_without_the_score_fills_the_best_n_and_says_so() -> None:
    records = [record(1, loss=0.5), record(2, step=2), record(3, loss=float("nan"))]
    reasons = retention_reasons(records, Retention(3, "loss", "min"))
    assert codes(reasons) == [["best"], ["best"], ["best", "latest"]]
    assert reasons[0][0].text == "#1 of the best 3 by loss (min)"
    assert reasons[2][0].text == "#2 of the best 3 by loss (min), though it has no loss"
    assert reasons[1][0].text == "#3 of the best 3 by loss (min), though it has no loss"


def test_nested_and_untrusted_scores() -> None:
    assert score_of(record(1, val={"loss": 0.25}), "val/loss") == 0.25
    assert score_of(record(1, loss="0.25"), "loss") is None
    assert score_of(record(1, loss=True), "loss") is None
    assert score_of(record(1, loss=float("nan")), "loss") is None
    assert score_of(record(1, loss=-math.inf), "loss") == -math.inf  # a score: the best loss
    assert score_of(record(1), "loss") is None


def test_no_records_no_reasons() -> None:
    assert retention_reasons([], Retention(1, "loss", "min")) == []


@pytest.mark.parametrize("seed", range(40))
def test_kept_exactly_when_decide_retention_keeps(seed: int) -> None:
    rng = random.Random(seed)
    indices = rng.sample(range(1, 50), rng.randint(0, 8))
    records = [record(i, **({} if rng.random() < 0.2 else {"loss": rng.choice([0.1, 0.2, 0.3])}))
               for i in indices]
    names = [r.dir_name for r in records] + [None]
    for num, attribute, order in itertools.product(
            (None, 1, 2, 5), (None, "loss"), ("max", "min")):
        resumed = rng.choice(names)
        pending = {name for name in names if name and rng.random() < 0.2}
        reasons = retention_reasons(records, Retention(num, attribute, order),
                                    resumed_from=resumed, pending=pending)
        # As the driver decides: pending validations protected, and out of the ranking.
        policy = ProtectPending(make_policy(num, attribute, order), pending.copy)
        keep = decide_retention(policy, records, protected=[resumed])
        assert [bool(found) for found in reasons] == keep, (num, attribute, order)


def test_the_resumed_checkpoint_is_protected_until_its_attempt_commits_a_newer_one() -> None:
    from cairn._src.checkpoint.index import RunIndex
    from cairn._src.checkpoint.retention import resume_protection

    # Attempt 1 (the index's second) resumed from checkpoint 2, committed by attempt 0.
    earlier = [CheckpointRecord(dir_name=f"checkpoint_{i:06d}", report_index=i, attempt=0)
               for i in (1, 2)]
    index = RunIndex(checkpoints=tuple(earlier), attempts=2,
                     resumed_from="checkpoint_000002")
    assert resume_protection(earlier, index) == "checkpoint_000002"
    newer = CheckpointRecord(dir_name="checkpoint_000003", report_index=3, attempt=1)
    assert resume_protection([*earlier, newer], index) is None
    # With num_to_keep=1, the newer one alone is kept once it committed.
    policy = make_policy(1, None, "max")
    records = [*earlier, newer]
    assert decide_retention(policy, records,
                            protected=[resume_protection(records, index)]) == [
        False, False, True]
    assert decide_retention(policy, earlier,
                            protected=[resume_protection(earlier, index)]) == [False, True]
    # A newer checkpoint of an earlier attempt (one the resume skipped) protects nothing.
    skipped = CheckpointRecord(dir_name="checkpoint_000004", report_index=4, attempt=0)
    assert resume_protection([*earlier, skipped], index) == "checkpoint_000002"
    assert resume_protection(earlier, RunIndex(attempts=2)) is None
