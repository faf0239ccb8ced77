"""Checks every fault-injection test makes once its run ends."""

from __future__ import annotations

import json
import os

import cairn
from cairn._src.checkpoint.manifest import MANIFEST_NAME


def check_run(run_dir: str, scratch: str) -> cairn.Result:
    """Nothing committed is lost, nothing partial remains, everything verifies."""
    result = cairn.Result.from_path(run_dir)
    committed = {c.path.rsplit("/", 1)[-1] for c, _ in result.best_checkpoints}
    for name in os.listdir(run_dir):
        if name.startswith("checkpoint_"):
            assert os.path.exists(os.path.join(run_dir, name, MANIFEST_NAME)), (
                f"{name} has no manifest: a partial checkpoint was left behind")
            assert name in committed, f"{name} is committed but the index does not name it"
    for checkpoint, _ in result.best_checkpoints:
        checkpoint.verify()
    for name in os.listdir(scratch):
        if name.startswith("sync_returned_"):
            index = json.load(open(os.path.join(scratch, name)))
            assert f"checkpoint_{index:06d}" in committed, (
                f"SYNC report {index} returned but its checkpoint is gone")
    indices = list(result.metrics_dataframe["report_index"])
    assert indices == sorted(indices) and len(set(indices)) == len(indices), indices
    return result


def resumed_steps(scratch: str) -> dict[tuple[int, int], int]:
    steps = {}
    for name in os.listdir(scratch):
        if name.startswith("resumed_"):
            _, attempt, rank = name.split("_")
            steps[(int(attempt), int(rank))] = json.load(open(os.path.join(scratch, name)))
    return steps


def run_dir(config: cairn.RunConfig) -> str:
    assert config.storage_path is not None and config.name is not None
    return os.path.join(os.fspath(config.storage_path), config.name)
