"""Training functions the Ray-API tests run in real worker processes."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any

import cairn
from cairn import Checkpoint, CheckpointUploadMode


class StepFailure(Exception):
    """Raised by a rank on purpose; importable by the driver, so it unpickles there."""

    def __init__(self, rank: int, step: int) -> None:
        super().__init__(f"rank {rank} failed at step {step}")
        self.rank = rank
        self.step = step

    def __reduce__(self) -> tuple[type, tuple[int, int]]:
        return (self.__class__, (self.rank, self.step))


def dict_checkpoint(data: dict[str, Any]) -> Checkpoint:
    directory = tempfile.mkdtemp()
    with open(os.path.join(directory, "data.json"), "w") as f:
        json.dump(data, f)
    return Checkpoint.from_directory(directory)


def load_dict(checkpoint: Checkpoint) -> dict[str, Any]:
    with checkpoint.as_directory() as d, open(os.path.join(d, "data.json")) as f:
        loaded: dict[str, Any] = json.load(f)
    return loaded


def scored_checkpoints(config: dict[str, Any]) -> None:
    """Ray's test_result pattern: metric-only reports between rank-0 checkpoints."""
    rank = cairn.get_context().get_world_rank()
    for i in range(config["iterations"]):
        cairn.report({"metric_a": -100, "metric_b": -100})
        checkpoint = dict_checkpoint({"iter": i}) if rank == 0 else None
        cairn.report({"metric_a": config.get("scores", {}).get(str(i), i), "metric_b": -i},
                     checkpoint=checkpoint)
    if config.get("fail") and rank == 0:
        # Rank 0 only, after its last SYNC report returned: every checkpoint is committed
        # (another rank failing first could cut rank 0's last upload short).
        raise RuntimeError("failing after the last report, as Ray's test does")


def fail_on_first_attempt(config: dict[str, Any]) -> str:
    """One report, then ``config['rank']`` fails on attempt 0 (``how``: raise or exit)."""
    context = cairn.get_context()
    rank = context.get_world_rank()
    cairn.report({"step": 0, "rank": rank})
    if rank == config["rank"] and (context.get_attempt() == 0 or config.get("always")):
        if config.get("how") == "exit":
            os._exit(3)
        if config.get("how") == "custom":
            raise StepFailure(rank, 0)
        raise ValueError(f"rank {rank} is broken")
    return "finished"


def mixed_reports(config: dict[str, Any]) -> None:
    """Metric-only, SYNC (rank 0 only), metric-only, ASYNC (both ranks) reports."""
    rank = cairn.get_context().get_world_rank()
    cairn.report({"step": 1, "rank": rank})
    checkpoint = dict_checkpoint({"step": 2}) if rank == 0 else None
    cairn.report({"step": 2, "rank": rank}, checkpoint=checkpoint)
    cairn.report({"step": 3, "rank": rank})
    own = tempfile.mkdtemp()
    with open(os.path.join(own, f"rank_{rank}.txt"), "w") as f:
        f.write(str(rank))
    handle = cairn.report({"step": 4, "rank": rank}, checkpoint=Checkpoint.from_directory(own),
                          checkpoint_upload_mode=CheckpointUploadMode.ASYNC)
    cairn.report({"step": 5, "rank": rank})
    handle.wait()


def upload_with_storage_context(config: dict[str, Any]) -> dict[str, str]:
    """Ray's documented checkpoint_upload_fn: copy into build_checkpoint_path_from_name."""
    storage = cairn.get_context().get_storage()

    def upload(checkpoint: Checkpoint, checkpoint_dir_name: str) -> Checkpoint:
        target = storage.build_checkpoint_path_from_name(checkpoint_dir_name)
        shutil.copytree(checkpoint.path, target)
        return Checkpoint.from_directory(target)

    if cairn.get_context().get_world_rank() == 0:
        cairn.report({}, checkpoint=dict_checkpoint({"checkpoint_key": "checkpoint_value"}),
                     checkpoint_dir_name="my_checkpoint_dir_name", checkpoint_upload_fn=upload)
    else:
        cairn.report({}, checkpoint=None)
    return {
        "experiment_fs_path": storage.experiment_fs_path,
        "experiment_dir_name": storage.experiment_dir_name,
        "storage_fs_path": storage.storage_fs_path,
        "filesystem": storage.storage_filesystem.type_name,
        "built": storage.build_checkpoint_path_from_name("x"),
    }


def torch_devices_and_seeds(config: dict[str, Any]) -> dict[str, Any]:
    """What cairn.torch's device and reproducibility helpers give inside a worker."""
    import random

    import numpy
    import torch

    import cairn.torch

    cairn.torch.enable_reproducibility(seed=config["seed"])
    return {
        "device": str(cairn.torch.get_device()),
        "devices": [str(d) for d in cairn.torch.get_devices()],
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "cublas": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "draws": [random.random(), float(numpy.random.rand()), float(torch.rand(1))],
    }
