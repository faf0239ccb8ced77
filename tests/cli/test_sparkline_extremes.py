"""The text chart of ``cairn plot`` over any floats: the largest doubles of either sign
(whose difference overflows), infinities, NaN and constants."""

from __future__ import annotations

from cairn._src.cli.plots import sparkline

BIGGEST = 1.7976931348623157e308
INF, NAN = float("inf"), float("nan")


def test_values_whose_span_overflows_are_drawn() -> None:
    assert sparkline([1.0, 1e308, -1e308, 2.0]) == "▅█▁▅"
    assert sparkline([-BIGGEST, 0.0, BIGGEST]) == "▁▅█"


def test_constant_huge_values_are_the_lowest_level() -> None:
    assert sparkline([BIGGEST] * 3) == "▁▁▁"
    assert sparkline([-BIGGEST] * 3) == "▁▁▁"


def test_infinities_are_gaps_and_scale_nothing() -> None:
    assert sparkline([INF, -INF, 1.0, NAN, 2.0]) == "  ▁ █"
    assert sparkline([INF, -INF, NAN]) == ""


def test_buckets_of_huge_values_average_without_overflow() -> None:
    assert sparkline([BIGGEST] * 20 + [-BIGGEST] * 20, width=4) == "██▁▁"
    assert sparkline([BIGGEST, INF] * 10, width=2) == "  "
