"""Run files that do not match their schema: fit() rebuilds the index from the manifests
with a warning, and skips bad log records (issue 10, item 7). Real runs, real processes."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import safety_workloads
from guards import bounded

import cairn
from cairn import Result, ScalingConfig, Trainer

RunConfigFactory = Callable[..., cairn.RunConfig]


def run_dir(config: cairn.RunConfig) -> Path:
    assert config.storage_path is not None and config.name is not None
    return Path(os.fspath(config.storage_path)) / config.name


def fit(config: cairn.RunConfig, scratch: str, steps: int) -> cairn.Result:
    trainer = Trainer(safety_workloads.steps_with_checkpoints,
                      train_loop_config={"steps": steps, "scratch": scratch},
                      scaling_config=ScalingConfig(num_workers=2), run_config=config)
    return bounded(trainer.fit)


def corrupt(index_path: Path, how: str) -> None:
    body: dict[str, Any] = json.loads(index_path.read_text())
    if how == "checkpoints_not_a_list":
        body["checkpoints"] = "abc"
    elif how == "string_report_index":
        body["checkpoints"][0]["report_index"] = "3"
    elif how == "dotdot_dir_name":
        body["checkpoints"][0]["dir_name"] = ".."
    elif how == "slash_dir_name":
        body["checkpoints"][0]["dir_name"] = "../../elsewhere"
    if how == "nested_200000_deep":
        index_path.write_text('{"version": 1, "checkpoints": ' + "[" * 200_000 + "]" * 200_000
                              + "}")
        return
    index_path.write_text(json.dumps(body))


@pytest.mark.parametrize("how", ["checkpoints_not_a_list", "string_report_index",
                                 "dotdot_dir_name", "slash_dir_name", "nested_200000_deep"])
def test_a_malformed_index_is_rebuilt_from_the_manifests(
    how: str, run_config: RunConfigFactory, scratch: str, caplog: pytest.LogCaptureFixture
) -> None:
    config = run_config()
    fit(config, scratch, steps=3)
    index_path = run_dir(config) / "cairn_run.json"
    corrupt(index_path, how)
    with caplog.at_level(logging.WARNING, logger="cairn"):
        result = fit(config, scratch, steps=5)
    assert "rebuilding the run index from the checkpoint manifests" in caplog.text
    assert "The run index" in caplog.text
    # Resumed from the latest committed checkpoint, numbering continued.
    assert Path(scratch, "resumed_at").read_text().split() == ["0", "3"]
    assert result.checkpoint is not None
    assert result.checkpoint.path.endswith("checkpoint_000005")
    index = json.loads(index_path.read_text())
    assert [r["dir_name"] for r in index["checkpoints"]][-1] == "checkpoint_000005"
    assert os.path.isdir(run_dir(config) / "checkpoint_000003")


def test_bad_metrics_records_are_skipped_by_fit_and_result(
    run_config: RunConfigFactory, scratch: str, caplog: pytest.LogCaptureFixture
) -> None:
    config = run_config()
    fit(config, scratch, steps=2)
    segment = run_dir(config) / "metrics" / "segment_000000.jsonl"
    with open(segment, "a") as f:
        f.write(json.dumps({"report_index": "abc", "metrics": {}}) + "\n")
        f.write("[" * 100_000 + "\n")
        f.write(json.dumps({"report_index": 2, "metrics": "nope"}) + "\n")
    with caplog.at_level(logging.WARNING, logger="cairn"):
        result = fit(config, scratch, steps=3)
        frame = Result.from_path(str(run_dir(config))).metrics_dataframe
    assert list(frame["report_index"]) == [1, 2, 3]
    assert result.metrics == {"step": 2}
    assert "Skipped 3 unreadable or invalid records" in caplog.text
