"""Validation results go through the checks report() makes of metrics (issue 26 item 6):
a score retention cannot rank by, or a metric name with a control character, fails that
validation with an error naming the function, the metric and the value; the run goes on."""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable
from typing import Any

import pytest
import v2_workloads
from test_validation import events

import cairn
from cairn import Checkpoint, CheckpointConfig, Trainer

RunConfigFactory = Callable[..., cairn.RunConfig]


def bad_validation(checkpoint: Checkpoint, **kwargs: Any) -> dict[str, Any]:
    with checkpoint.as_directory() as d, open(os.path.join(d, "score.json")) as f:
        score = json.load(f)["score"]
    return [{"val_score": math.nan}, {"val_score": "high"}, {"val\x1bscore": 3},
            {"val_score": None}, {"val_score": 7}][score]


def test_a_validation_whose_metrics_report_would_refuse_fails_and_the_run_goes_on(
    run_config: RunConfigFactory, scratch: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="cairn")
    config = run_config(checkpoint_config=CheckpointConfig(
        checkpoint_score_attribute="val_score"))
    result = Trainer(
        v2_workloads.validating,
        train_loop_config={"epochs": 5, "scores": [0, 1, 2, 3, 4], "scratch": scratch},
        run_config=config, validation_config=cairn.ValidationConfig(bad_validation),
    ).fit()
    run = os.path.join(os.fspath(config.storage_path), "run")
    finished = {e["dir_name"]: (e["status"], e["metrics"])
                for e in events(run, "validation_finished")}
    # A NaN score is merged (it ranks as the worst, as in Ray Train).
    status, merged = finished.pop("checkpoint_000001")
    assert status == "VALIDATED" and math.isnan(merged.pop("val_score")) and merged == {}
    assert finished == {"checkpoint_000002": ("VALIDATION_FAILED", {}),
                        "checkpoint_000003": ("VALIDATION_FAILED", {}),
                        # None is no score either (it would erase the reported one).
                        "checkpoint_000004": ("VALIDATION_FAILED", {}),
                        "checkpoint_000005": ("VALIDATED", {"val_score": 7})}
    messages = [r.getMessage() for r in caplog.records]
    what = "The validation function bad_validation returned metrics for checkpoint_00000"
    assert any(m.startswith(f"{what}2 that has 'val_score'='high'; the "
                            "checkpoint_score_attribute must be a number") for m in messages)
    assert any(m.startswith(f"{what}3 that has the metric name 'val\\x1bscore', which holds "
                            "the control character '\\x1b'") for m in messages)
    assert any(m.startswith(f"{what}4 that has no 'val_score'") for m in messages), messages
    assert all("its metrics are not merged" in m and "the run goes on" in m
               for m in messages)
    # The failed validations left the reported metrics alone, in the index and manifests.
    metrics = {os.path.basename(c.path): m for c, m in result.best_checkpoints}
    assert math.isnan(metrics["checkpoint_000001"].pop("val_score"))
    assert metrics["checkpoint_000001"] == {"epoch": 0}
    assert metrics["checkpoint_000005"] == {"epoch": 4, "val_score": 7}
    with open(os.path.join(run, "checkpoint_000002", "_cairn_manifest.json")) as f:
        assert json.load(f)["metrics"] == {"epoch": 1}


def _losses_reported(config: dict[str, Any]) -> None:
    """Three checkpoints with losses 0.1, 0.5, 0.9 (the first the best); only the first is
    validated. ``flat``: the loss is reported as the flat key 'val/loss'."""
    for epoch, loss in enumerate([0.1, 0.5, 0.9]):
        metrics = {"val/loss": loss} if config["flat"] else {"val": {"loss": loss}}
        directory = os.path.join(config["scratch"], str(epoch))
        os.makedirs(directory)
        with open(os.path.join(directory, "w"), "w") as f:
            f.write(str(epoch))
        cairn.report({"epoch": epoch, **metrics},
                     checkpoint=Checkpoint.from_directory(directory), validation=epoch == 0)


def _merged_badly(checkpoint: Checkpoint, *, value: dict[str, Any]) -> dict[str, Any]:
    return value


@pytest.mark.parametrize(("flat", "validated", "message"), [
    # The shallow merge (Ray Train's) would replace 'val' and erase the reported loss.
    (False, {"val": {"accuracy": 0.99}},
     "that replace 'val' of the checkpoint's reported metrics with {'accuracy': 0.99}, "
     "which has no 'val/loss', the checkpoint_score_attribute: retention would rank the "
     "checkpoint last."),
    (False, {"val": 3}, "that replace 'val' of the checkpoint's reported metrics with 3"),
    # The report's flat key would shadow the validation's nested score.
    (True, {"val": {"loss": 0.95}},
     "that give 'val/loss' nested, while the checkpoint's reported metrics have the flat "
     "key 'val/loss', which retention reads first: return it as the flat key 'val/loss' "
     "too."),
])
def test_a_validation_that_would_lose_or_shadow_the_score_fails_and_keeps_the_best(
    run_config: RunConfigFactory, scratch: str, caplog: pytest.LogCaptureFixture,
    flat: bool, validated: dict[str, Any], message: str,
) -> None:
    caplog.set_level(logging.ERROR, logger="cairn")
    config = run_config(progress=0, checkpoint_config=CheckpointConfig(
        num_to_keep=1, checkpoint_score_attribute="val/loss", checkpoint_score_order="min"))
    result = Trainer(
        _losses_reported, train_loop_config={"flat": flat, "scratch": scratch},
        scaling_config=cairn.ScalingConfig(num_workers=0), run_config=config,
        validation_config=cairn.ValidationConfig(
            _merged_badly, cairn.ValidationTaskConfig(fn_kwargs={"value": validated})),
    ).fit()
    run = os.path.join(os.fspath(config.storage_path), "run")
    assert [(e["dir_name"], e["status"]) for e in events(run, "validation_finished")] == [
        ("checkpoint_000001", "VALIDATION_FAILED")]
    what = ("The validation function _merged_badly returned metrics for checkpoint_000001 "
            + message)
    assert any(r.getMessage().startswith(what) for r in caplog.records), caplog.text
    # The best checkpoint (loss 0.1) keeps its reported score and its place.
    assert sorted(os.path.basename(c.path) for c, _ in result.best_checkpoints) == [
        "checkpoint_000001", "checkpoint_000003"]
    assert os.path.isdir(os.path.join(run, "checkpoint_000001"))
