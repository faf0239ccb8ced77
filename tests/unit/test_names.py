"""Checkpoint directory names a report may choose, and metrics too deep to accept
(issue 10, items 3 and 11). Messages checked exactly."""

from __future__ import annotations

from typing import Any

import pytest

from cairn import ReportError
from cairn._src.execution.validation import check_dir_name, validate_metrics
from cairn._src.run.layout import is_safe_dir_name, is_stored_dir_name

SAFE = (r"is not a safe directory name: use one path component of letters, digits and '_', "
        r"'-', '\.', '=' \(not starting with '\.' or '-', no '\.\.', no whitespace, at most 200 "
        r"characters\)\.$")
OWN = (r"names one of Cairn's own entries in the run directory; choose another name "
       r"\(reserved: '_cairn_manifest\.json', 'cairn_run\.json', 'events', 'lease\.json', "
       r"'metrics', any name starting with '_cairn' or containing '\.cairn-tmp-', in any "
       r"letter case\)\.$")
DEFAULT = (r"has the form of the names Cairn gives checkpoints itself \('checkpoint_' and 6 or "
           r"more digits\), which a later report may need; choose another name, or leave "
           r"checkpoint_dir_name out to get the default one\.$")


@pytest.mark.parametrize(
    ("name", "shown", "message"),
    [
        ("ckpt\n", r"'ckpt\\n'", SAFE),
        ("ckpt\r\n", r"'ckpt\\r\\n'", SAFE),
        ("a/b", r"'a/b'", SAFE),
        ("..", r"'\.\.'", SAFE),
        ("a..b", r"'a\.\.b'", SAFE),
        (".hidden", r"'\.hidden'", SAFE),
        ("x" * 201, r"'x{76}\.\.\.", SAFE),
        (3, "3", SAFE),
        ("_cairn_manifest.json", r"'_cairn_manifest\.json'", OWN),
        ("lease.json", r"'lease\.json'", OWN),
        ("cairn_run.json", r"'cairn_run\.json'", OWN),
        ("metrics", r"'metrics'", OWN),
        ("Events", r"'Events'", OWN),
        ("_cairn_later", r"'_cairn_later'", OWN),
        ("ckpt.cairn-tmp-1234", r"'ckpt\.cairn-tmp-1234'", OWN),
        ("checkpoint_000003", r"'checkpoint_000003'", DEFAULT),
        ("checkpoint_1234567", r"'checkpoint_1234567'", DEFAULT),
        ("Checkpoint_000003", r"'Checkpoint_000003'", DEFAULT),
    ],
)
def test_refused_names(name: Any, shown: str, message: str) -> None:
    with pytest.raises(ReportError, match=rf"^report\(checkpoint_dir_name={shown}\) {message}"):
        check_dir_name(name)


@pytest.mark.parametrize("name", ["best", "epoch-1", "checkpoint_epoch=3", "checkpoint_00003",
                                  "checkpoint_000003_final", "x" * 200, "my.ckpt"])
def test_accepted_names(name: str) -> None:
    assert check_dir_name(name) == name
    assert is_safe_dir_name(name) and is_stored_dir_name(name)


def test_names_read_back_are_checked_more_loosely_but_never_leave_the_run() -> None:
    assert is_stored_dir_name("checkpoint_000003") and is_stored_dir_name("Old Name")
    for bad in ["", ".", "..", "a/b", "a\\b", "a\0b", "metrics", "x.cairn-tmp-1", "é" * 128]:
        assert not is_stored_dir_name(bad), bad


def nested(depth: int) -> dict[str, Any]:
    metrics: dict[str, Any] = {"loss": 1.0}
    inner = metrics
    for _ in range(depth - 1):
        inner["deeper"] = {}
        inner = inner["deeper"]
    return metrics


def test_metrics_nested_beyond_64_levels_are_a_report_error() -> None:
    assert validate_metrics(nested(64))["loss"] == 1.0
    with pytest.raises(ReportError, match=r"^report\(metrics=\.\.\.\) is nested more than 64 "
                       r"levels deep; report flat metrics \(for example 'a/b/c' keys instead "
                       r"of nested dicts\)\.$"):
        validate_metrics(nested(65))
    with pytest.raises(ReportError, match="is nested more than 64 levels deep"):
        validate_metrics(nested(100_000))


def test_metrics_that_refer_to_themselves_are_a_report_error() -> None:
    metrics: dict[str, Any] = {"a": 1}
    metrics["self"] = metrics
    with pytest.raises(ReportError, match="is nested more than 64 levels deep"):
        validate_metrics(metrics)
