"""Result.get_best_checkpoint ranks as retention does: numbers only, never NaN, a string
or a bool."""

from __future__ import annotations

from typing import Any

import pytest

from cairn import Checkpoint, Result


def _result(values: list[Any]) -> Result:
    return Result(metrics={}, checkpoint=None, error=None, path="/bucket/path",
                  best_checkpoints=[(Checkpoint(f"/bucket/path/ckpt{i}"), {"loss": value})
                                    for i, value in enumerate(values)])


@pytest.mark.parametrize("mode", ["max", "min"])
def test_a_nan_first_is_never_the_best(mode: str) -> None:
    result = _result([float("nan"), 2.0, 1.0, 3.0])
    best = result.get_best_checkpoint("loss", mode)
    assert best is not None
    assert best.path == ("/bucket/path/ckpt3" if mode == "max" else "/bucket/path/ckpt2")


@pytest.mark.parametrize("mode", ["max", "min"])
def test_strings_and_bools_are_skipped_without_a_type_error(mode: str) -> None:
    result = _result(["high", 2, True, 5.0, False, None])
    best = result.get_best_checkpoint("loss", mode)
    assert best is not None
    assert best.path == ("/bucket/path/ckpt3" if mode == "max" else "/bucket/path/ckpt1")


def test_no_rankable_value_is_a_lookup_error() -> None:
    with pytest.raises(RuntimeError, match=r"No checkpoint has a number for the metric 'loss' "
                                           r"to rank by .*\[nan, 'x', True\]"):
        _result([float("nan"), "x", True]).get_best_checkpoint("loss", "min")
