"""check_merged_score: which validation metrics may be merged into a checkpoint's reported
ones without leaving retention a score the validation did not give (pure logic)."""

from __future__ import annotations

from typing import Any

import pytest

from cairn._src.errors import ReportError
from cairn._src.run.report_checks import check_merged_score

WHAT = "The validation function f returned metrics for checkpoint_000001 that"


@pytest.mark.parametrize(("reported", "validated"), [
    ({"val": {"loss": 0.1}}, {"val": {"loss": 0.2, "accuracy": 0.9}}),  # nested, replaced
    ({"val": {"loss": 0.1}}, {"val/loss": 0.2}),  # a flat key is read first: the new one
    ({"val/loss": 0.1}, {"val/loss": 0.2}),
    ({"val/loss": 0.1}, {"accuracy": 0.9}),  # the reported score stays
    ({"val": {"loss": 0.1}}, {"train": {"loss": 3}}),
    ({"epoch": 0}, {"val": {"accuracy": 0.9}}),  # no score reported to lose
    ({"val/loss": 0.5}, {"val": {"loss": float("0.5")}}),  # shadowed by the same value
])
def test_merges_that_keep_a_score_retention_can_use(reported: dict[str, Any],
                                                     validated: dict[str, Any]) -> None:
    check_merged_score(reported, validated, "val/loss", what=WHAT)


def test_without_a_score_attribute_anything_merges() -> None:
    check_merged_score({"val": {"loss": 0.1}}, {"val": None}, None, what=WHAT)


@pytest.mark.parametrize(("reported", "validated", "message"), [
    ({"val": {"loss": 0.1}}, {"val": None},
     f"{WHAT} replace 'val' of the checkpoint's reported metrics with None, which has no "
     "'val/loss'"),
    ({"val": {"loss": 0.1}}, {"val": {"acc": 1}},
     f"{WHAT} replace 'val' of the checkpoint's reported metrics with {{'acc': 1}}"),
    ({"val/loss": 0.1}, {"val": {"loss": 0.2}},
     f"{WHAT} give 'val/loss' nested, while the checkpoint's reported metrics have the "
     "flat key 'val/loss'"),
])
def test_merges_that_would_erase_or_shadow_the_score_are_refused(
        reported: dict[str, Any], validated: dict[str, Any], message: str) -> None:
    with pytest.raises(ReportError) as raised:
        check_merged_score(reported, validated, "val/loss", what=WHAT)
    assert str(raised.value).startswith(message)
