"""Scores and plotted values that no float holds: a clear error at report(), skipped
where they are read back (an int of 400 digits is valid JSON, and math.isnan of it
raises OverflowError)."""

from __future__ import annotations

import math

import pytest

from cairn import ReportError
from cairn._src.plots.series import _number
from cairn._src.run.report_checks import check_score_attribute, rankable


def test_a_score_no_double_holds_is_refused_naming_it() -> None:
    with pytest.raises(ReportError) as caught:
        check_score_attribute({"loss": 10**400}, "loss")
    message = str(caught.value)
    assert "report(metrics=...) has 'loss'=1000000000" in message
    assert "must be a number (within a double's range, below 1.8e+308 in magnitude)" in message
    assert len(message) < 300


def test_a_nan_score_is_accepted() -> None:
    # As in Ray Train: the checkpoint ranks as the worst (tests/checkpoint/test_nan_score.py).
    check_score_attribute({"loss": math.nan}, "loss")


@pytest.mark.parametrize(("value", "expected"), [
    (1, 1.0), (-2.5, -2.5), (10**300, 1e300), (math.inf, math.inf),
    (10**400, None), (-(10**400), None), (math.nan, None), (True, None), ("1", None),
    (None, None)])
def test_rankable(value: object, expected: float | None) -> None:
    assert rankable(value) == expected


def test_a_plotted_value_no_double_holds_is_skipped() -> None:
    assert _number(10**400) is None
    assert _number(math.inf) is None
    assert _number(3) == 3.0
