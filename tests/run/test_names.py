"""Checkpoint directory names a report may choose, and metrics too deep to accept
(issue 10, items 3 and 11). Messages checked exactly."""

from __future__ import annotations

import re
from typing import Any

import pytest

from cairn import ReportError
from cairn._src.run.layout import is_safe_dir_name, is_stored_dir_name
from cairn._src.run.report_checks import check_dir_name, validate_metrics

RULE = (r"use one path component of letters, digits and '_', '-', '\.', '=' \(not starting "
        r"with '\.' or '-', no '\.\.', no whitespace, at most 200 characters\)\.$")
SAFE = r"is not a safe directory name: " + RULE


def control(shown: str) -> str:
    """The message for a name holding a control character, shown escaped."""
    return (r"is not a safe directory name \(it holds the control character "
            + re.escape(shown) + r"\): " + RULE)


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
        ("ckpt\n", r"'ckpt\\n'", control(r"'\n'")),
        ("ckpt\r\n", r"'ckpt\\r\\n'", control(r"'\r'")),
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


class _Name(str):
    pass


def _json_copy(metrics: dict[str, Any]) -> dict[str, Any]:
    import json

    copied: dict[str, Any] = json.loads(json.dumps(metrics, allow_nan=True))
    return copied


@pytest.mark.parametrize("metrics", [
    {"step": 3, "loss": 0.25},
    {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf"), "-0": -0.0},
    {"big": 10**40, "tiny": 5e-324, "third": 1 / 3, "flag": True, "off": False, "none": None},
    {"text": "é\u2603\ud800", "": "empty key", "emoji": "\U0001f600"},
    {},
])
def test_flat_metrics_copy_as_their_json_round_trip(metrics: dict[str, Any]) -> None:
    import json

    copied = validate_metrics(metrics)
    expected = _json_copy(metrics)
    assert copied is not metrics
    assert list(copied) == list(expected)
    # Same values and types (NaN compared by its text, -0.0 by its sign).
    assert [(type(v), repr(v)) for v in copied.values()] == [
        (type(v), repr(v)) for v in expected.values()]
    assert json.dumps(copied, allow_nan=True) == json.dumps(expected, allow_nan=True)
    metrics["added later"] = 1
    assert "added later" not in copied


def test_metrics_other_than_flat_plain_values_still_take_the_json_round_trip() -> None:
    import enum

    class Level(enum.IntEnum):
        HIGH = 2

    # A subclass of a plain type is not kept as itself: it comes back as the plain value.
    copied = validate_metrics({"level": Level.HIGH, _Name("name"): 1, "nested": {"a": (1, 2)}})
    assert copied == {"level": 2, "name": 1, "nested": {"a": [1, 2]}}
    assert type(copied["level"]) is int and all(type(key) is str for key in copied)
    with pytest.raises(ReportError, match="has the key 3 of type int"):
        validate_metrics({3: 1.0})
    with pytest.raises(ReportError, match=r"must be a dict of metric names to values, not list"):
        validate_metrics([("loss", 1.0)])
