"""Ray Train's Hugging Face Accelerate guide on Cairn (accelerate_workloads.py says what
stands in for the Hub's model and data): every rank reports its directory holding
``ckpt_<epoch>.bin``.

On CPUs, ``Accelerator()`` sees the process group only when told the run is on CPUs
(``ACCELERATE_USE_CPU``, which TorchTrainer sets for ``use_gpu=False``). Then Accelerate
trains one DDP model and writes it on the main process only, and a loop that saves the
unwrapped model on every rank writes identical bytes, stored once. Without it every rank
trains a model of its own and saves it: different files under one name, which Cairn
refuses (docs/ray-compat.md)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("accelerate")
pytest.importorskip("torch")

import accelerate_workloads
import torch

import cairn
from cairn import RunConfig, ScalingConfig
from cairn.torch import TorchTrainer

CONFIG = {"lr": 2e-2, "num_epochs": 2, "seed": 42, "train_batch_size": 8,
          "eval_batch_size": 16}


@pytest.mark.parametrize("every_rank_saves", [False, True],
                         ids=["accelerator.save", "torch.save-on-every-rank"])
def test_the_accelerate_guide_runs_and_commits_each_epochs_model(
    tmp_path: Path, scratch: str, every_rank_saves: bool
) -> None:
    result = TorchTrainer(
        accelerate_workloads.train_func,
        train_loop_config={**CONFIG, "scratch": scratch, "every_rank_saves": every_rank_saves},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="accelerate", storage_path=str(tmp_path / "storage")),
    ).fit()
    assert [metrics["epoch"] for _, metrics in result.best_checkpoints] == [0, 1]
    assert {metrics["num_processes"] for _, metrics in result.best_checkpoints} == {2}
    # accelerator.save writes on the main process only; torch.save on every rank writes
    # the same bytes there (DDP keeps the weights equal, torch.save's archive holds no
    # time or process), which Cairn stores once.
    files = {name: Path(scratch, name).read_text() for name in os.listdir(scratch)}
    assert files["files_1_0.txt"] == "ckpt_1.bin"
    assert files["files_1_1.txt"] == ("ckpt_1.bin" if every_rank_saves else "")
    assert result.checkpoint is not None
    manifest = result.checkpoint.get_manifest()
    assert manifest is not None and set(manifest.files) == {"ckpt_1.bin"}
    with result.checkpoint.as_directory() as directory:
        model = torch.load(os.path.join(directory, "ckpt_1.bin"), weights_only=False)
    assert isinstance(model, accelerate_workloads.TinyClassifier)
    assert cairn.Result.from_path(str(tmp_path / "storage" / "accelerate")).checkpoint


def test_ranks_that_train_models_of_their_own_and_save_them_under_one_name_are_refused(
    tmp_path: Path, scratch: str
) -> None:
    # As on Ray Train with CPUs: Accelerate not told the run is on CPUs, each rank its own
    # data shard. The models differ in value, not only in bytes: nothing is overwritten.
    with pytest.raises(cairn.TrainingFailedError,
                       match=r"CheckpointCollisionError: Ranks 0 and 1 both wrote 'ckpt_0.bin' "
                       r"into the checkpoint of report 1 with different content \(different "
                       r"checksums\); nothing was overwritten and the checkpoint is not "
                       r"committed\."):
        TorchTrainer(
            accelerate_workloads.train_func,
            train_loop_config={**CONFIG, "scratch": scratch, "shard_by_rank": True},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(name="accelerate", storage_path=str(tmp_path / "storage"),
                                 worker_env={"ACCELERATE_USE_CPU": "false"}),
        ).fit()
