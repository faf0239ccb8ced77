"""``Result.from_path`` and ``Result.get_best_checkpoint`` refuse an argument of the wrong
type with a :class:`ConfigError` that names it, the value and what is accepted."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cairn import Checkpoint, ConfigError, Result

_PATH_ACCEPTED = ("needs the run directory as a str or a path object (pathlib.Path): a "
                  "local path such as '/tmp/runs/my_run', or a URI such as "
                  "'s3://bucket/runs/my_run'.")


@pytest.mark.parametrize("path", [None, 5, b"/tmp/runs/my_run"])
def test_from_path_refuses_a_path_that_is_no_str_or_path_object(path: object) -> None:
    with pytest.raises(ConfigError, match=re.escape(
            f"Result.from_path(path={path!r}) {_PATH_ACCEPTED}")):
        Result.from_path(path)  # type: ignore[arg-type]


def test_from_path_refuses_a_checkpoint_config_that_is_no_checkpoint_config(
        tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape(
            "Result.from_path(checkpoint_config='val/loss') must be a "
            "cairn.CheckpointConfig or None.")):
        Result.from_path(tmp_path, checkpoint_config="val/loss")  # type: ignore[arg-type]


@pytest.mark.parametrize("metric", [5, None, ("val", "loss")])
def test_get_best_checkpoint_refuses_a_metric_that_is_no_str(metric: object) -> None:
    result = Result(metrics={"loss": 1.0}, checkpoint=None, error=None, path="/runs/r",
                    best_checkpoints=[(Checkpoint("/runs/r/checkpoint_000001"),
                                       {"loss": 1.0})])
    with pytest.raises(ConfigError, match=re.escape(
            f"get_best_checkpoint(metric={metric!r}) must be a str: the name of a reported "
            "metric, with '/' between nested keys ('val/loss').")):
        result.get_best_checkpoint(metric, "max")  # type: ignore[arg-type]
