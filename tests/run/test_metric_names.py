"""report() refuses control characters in metric names (at any depth) and in
checkpoint_dir_name, with a message that is itself free of them (issue 26 item 4)."""

from __future__ import annotations

import re

import pytest

from cairn import ReportError
from cairn._src.run.report_checks import check_dir_name, validate_metrics

CONTROL = ["\x00", "\n", "\x1b", "\x7f", "\x85", "\x9b"]


@pytest.mark.parametrize("char", CONTROL)
def test_a_flat_metric_name_with_a_control_character_is_refused(char: str) -> None:
    expected = (f"report(metrics=...) has the metric name {'loss' + char!a}, which holds the "
                f"control character {char!a}; metric names may not hold control characters")
    with pytest.raises(ReportError, match=f"^{re.escape(expected)}") as caught:
        validate_metrics({"loss" + char: 1.0})
    assert char not in str(caught.value)


@pytest.mark.parametrize("metrics", [
    {"eval": {"acc\x1b[2J": 1}},
    {"per_class": [{"ok": 1}, {"c\x9b": 2}]},
    {"eval": {"loss": [1, 2]}, "x\n": "type"},
])
def test_a_nested_metric_name_with_a_control_character_is_refused(
        metrics: dict[str, object]) -> None:
    with pytest.raises(ReportError, match=r"has the metric name '.*\\(x1b|x9b|n)'"):
        validate_metrics(metrics)


def test_values_and_plain_names_are_not_refused() -> None:
    assert validate_metrics({"note": "line\nbreak", "eval": {"acc/top-1": 0.5}}) == {
        "note": "line\nbreak", "eval": {"acc/top-1": 0.5}}


def test_a_checkpoint_dir_name_with_a_control_character_is_refused_by_name() -> None:
    with pytest.raises(ReportError, match=(
            r"^report\(checkpoint_dir_name='step\\x1b\[2J'\) is not a safe directory name "
            r"\(it holds the control character '\\x1b'\): use one path component")) as caught:
        check_dir_name("step\x1b[2J")
    assert "\x1b" not in str(caught.value)
