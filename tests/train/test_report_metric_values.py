"""Metric values report() must refuse or accept, with a real worker process: an int too
large to store is refused where it is reported, naming the metric and its size (never
its repr, which Python refuses too); a mapping that is not a dict is taken as a dict."""

from __future__ import annotations

import collections
import json
import logging
import os
import sys
import tempfile
import types
from collections.abc import Callable
from typing import Any

import pytest
import v2_workloads
from test_validation import events
from workloads import run_dir

import cairn
from cairn import (
    Checkpoint,
    CheckpointConfig,
    ReportError,
    ScalingConfig,
    Trainer,
    TrainingFailedError,
)

RunConfigFactory = Callable[..., cairn.RunConfig]

_TOO_LARGE = ("too large to store: an int in metrics may have at most 4300 digits. Report "
              "a smaller number instead (its logarithm, for example).")


def _checkpoint(scratch: str, name: str) -> Checkpoint:
    directory = os.path.join(scratch, name)
    os.makedirs(directory)
    with open(os.path.join(directory, "weights.bin"), "wb") as f:
        f.write(b"w")
    return Checkpoint.from_directory(directory)


def _deep_mappings(depth: int) -> dict[str, Any]:
    inner: dict[str, Any] = {"leaf": 1}
    for _ in range(depth):
        inner = {"k": types.MappingProxyType(inner)}
    return inner


def test_an_int_too_large_to_store_is_refused_by_report_naming_the_metric(
    run_config: RunConfigFactory, scratch: str
) -> None:
    def train(config: dict[str, Any]) -> list[str]:
        errors = []
        bad: list[tuple[dict[str, Any], bool]] = [
            ({"loss": 0.5, "a": 10**5000}, False),           # a metrics-only report
            ({"loss": 10**5000}, True),                      # the checkpoint's score
            ({"loss": 1.0, "x": [10**5000]}, True),          # nested, in a checkpoint report
            ({"loss": 1.0, "x": {"y": [2, -(10**4300)]}}, False),   # 4301 digits
            ({"loss": 1.0, "deep": _deep_mappings(70)}, False),      # nested mappings
        ]
        for number, (metrics, with_checkpoint) in enumerate(bad):
            checkpoint = _checkpoint(config["scratch"], f"bad{number}") if with_checkpoint \
                else None
            try:
                cairn.report(metrics, checkpoint=checkpoint)
            except ReportError as exc:
                errors.append(str(exc))
        # A worker that lifts Python's digit limit still may not store what the driver
        # and every later reader cannot read back.
        sys.set_int_max_str_digits(0)
        try:
            cairn.report({"loss": 1.0, "x": [10**5000]})
        except ReportError as exc:
            errors.append(str(exc))
        sys.set_int_max_str_digits(4300)
        cairn.report({"loss": 0.25, "largest": 10**4300 - 1},
                     checkpoint=_checkpoint(config["scratch"], "good"))
        return errors

    config = run_config(checkpoint_config=CheckpointConfig(checkpoint_score_attribute="loss"))
    result = Trainer(train, train_loop_config={"scratch": scratch},
                     scaling_config=ScalingConfig(num_workers=1), run_config=config).fit()
    assert result.error is None
    assert result.return_value == [
        f"report(metrics=...) has an int of 5001 digits for 'a', {_TOO_LARGE}",
        f"report(metrics=...) has an int of 5001 digits for 'loss', {_TOO_LARGE}",
        f"report(metrics=...) has an int of 5001 digits for 'x'[0], {_TOO_LARGE}",
        f"report(metrics=...) has an int of 4301 digits for 'x'['y'][1], {_TOO_LARGE}",
        "report(metrics=...) is nested more than 64 levels deep; report flat metrics (for "
        "example 'a/b/c' keys instead of nested dicts).",
        f"report(metrics=...) has an int of 5001 digits for 'x'[0], {_TOO_LARGE}",
    ]
    # The refused reports took no report number and left nothing behind; the int of 4300
    # digits was stored and reads back.
    stored = cairn.Result.from_path(run_dir(config))
    assert stored.metrics == {"loss": 0.25, "largest": 10**4300 - 1}
    assert [m["report_index"] for m in stored.metrics_dataframe.to_dict("records")] == [1]
    assert sorted(n for n in os.listdir(run_dir(config)) if n.startswith("checkpoint")) == [
        "checkpoint_000001"]


def test_an_int_too_large_to_store_fails_the_run_with_a_report_error(
    run_config: RunConfigFactory,
) -> None:
    def train(config: dict[str, Any]) -> None:
        cairn.report({"a": 10**5000})
        cairn.report({"b": 1})

    config = run_config(failure_config=cairn.FailureConfig(max_failures=3))
    with pytest.raises(TrainingFailedError,
                       match=r"\[rank 0\] ReportError: report\(metrics=\.\.\.\) has an int of "
                             r"5001 digits for 'a', too large to store") as info:
        Trainer(train, scaling_config=ScalingConfig(num_workers=1), run_config=config).fit()
    assert "ValueError" not in str(info.value)
    # Bad input is fatal: no restart wastes the failure budget on it.
    assert cairn.Result.from_path(run_dir(config)).goodput.attempts == 1


def huge_validation(checkpoint: Checkpoint, **kwargs: Any) -> dict[str, Any]:
    with checkpoint.as_directory() as d, open(os.path.join(d, "score.json")) as f:
        score = json.load(f)["score"]
    # The last as a read-only mapping: a validation may return any mapping, as report().
    return [{"val_score": 10**5000}, {"val_score": {"nested": [10**5000]}},
            types.MappingProxyType({"val_score": 7})][score]


def test_a_validation_score_too_large_to_store_fails_that_validation_and_the_run_goes_on(
    run_config: RunConfigFactory, scratch: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="cairn")
    config = run_config(checkpoint_config=CheckpointConfig(
        checkpoint_score_attribute="val_score"))
    result = Trainer(
        v2_workloads.validating,
        train_loop_config={"epochs": 3, "scores": [0, 1, 2], "scratch": scratch},
        run_config=config, validation_config=cairn.ValidationConfig(huge_validation),
    ).fit()
    assert result.error is None
    finished = {e["dir_name"]: (e["status"], e["metrics"])
                for e in events(run_dir(config), "validation_finished")}
    assert finished == {"checkpoint_000001": ("VALIDATION_FAILED", {}),
                        "checkpoint_000002": ("VALIDATION_FAILED", {}),
                        "checkpoint_000003": ("VALIDATED", {"val_score": 7})}
    messages = [r.getMessage() for r in caplog.records]
    what = "The validation function huge_validation returned metrics for checkpoint_00000"
    assert any(m.startswith(f"{what}1 that has an int of 5001 digits for 'val_score', "
                            f"{_TOO_LARGE} The validation is VALIDATION_FAILED")
               for m in messages), messages
    assert any(m.startswith(f"{what}2 that has an int of 5001 digits for "
                            f"'val_score'['nested'][0], {_TOO_LARGE}")
               for m in messages), messages
    assert all(r.exc_info is None for r in caplog.records)


def test_a_mapping_that_is_not_a_dict_is_reported_as_a_dict(
    run_config: RunConfigFactory, scratch: str
) -> None:
    def train(config: dict[str, Any]) -> None:
        cairn.report(types.MappingProxyType({"loss": 1.0}))
        cairn.report(collections.ChainMap({"loss": 0.5}, {"loss": 9.0, "step": 2}))
        cairn.report({"loss": 0.75, "val": types.MappingProxyType({"acc": 0.5})})
        checkpoint = _checkpoint(tempfile.mkdtemp(dir=config["scratch"]), "c")
        cairn.report(types.MappingProxyType({"loss": 0.25}), checkpoint=checkpoint)

    config = run_config(checkpoint_config=CheckpointConfig(checkpoint_score_attribute="loss"))
    result = Trainer(train, train_loop_config={"scratch": scratch},
                     scaling_config=ScalingConfig(num_workers=1), run_config=config).fit()
    assert result.error is None
    assert type(result.metrics) is dict and result.metrics == {"loss": 0.25}
    history = cairn.Result.from_path(run_dir(config)).metrics_dataframe.to_dict("records")
    assert [(m["report_index"], m["loss"]) for m in history] == [
        (1, 1.0), (2, 0.5), (3, 0.75), (4, 0.25)]
    assert history[1]["step"] == 2
    assert history[2]["val/acc"] == 0.5
    assert [os.path.basename(c.path) for c, _ in result.best_checkpoints] == [
        "checkpoint_000004"]
