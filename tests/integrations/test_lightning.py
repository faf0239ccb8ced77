"""cairn.lightning: the report callback, strategy, cluster environment and prepare_trainer
in real runs, with a kill -9 and a resume, and their argument checks."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
try:
    import lightning.pytorch as pl
except ModuleNotFoundError:
    pl = pytest.importorskip("pytorch_lightning")

import lightning_workloads
import torch

import cairn
from cairn import ConfigError, FailureConfig, RunConfig, ScalingConfig
from cairn.lightning import (
    CairnDDPStrategy,
    CairnLightningEnvironment,
    CairnReportCallback,
    RayDDPStrategy,
    RayDeepSpeedStrategy,
    RayFSDPStrategy,
    RayLightningEnvironment,
    RayTrainReportCallback,
    prepare_trainer,
)
from cairn.torch import TorchTrainer


def _fit(tmp_path: Path, validation_config: cairn.ValidationConfig | None = None,
         num_workers: int = 2, **config: object) -> cairn.Result:
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    # The workers' temporary directory, where the callback stages each checkpoint.
    (tmp_path / "worker_tmp").mkdir(exist_ok=True)
    trainer = TorchTrainer(
        lightning_workloads.train_lightning,
        train_loop_config={"root_dir": str(tmp_path / "lightning_root"),
                           "scratch": str(scratch), **config},
        scaling_config=ScalingConfig(num_workers=num_workers),
        validation_config=validation_config,
        run_config=RunConfig(name="lightning", storage_path=str(tmp_path / "runs"),
                             failure_config=FailureConfig(max_failures=1),
                             worker_env={"TMPDIR": str(tmp_path / "worker_tmp")}),
    )
    return trainer.fit()


def _saved(checkpoint: cairn.Checkpoint) -> dict[str, Any]:
    with checkpoint.as_directory() as directory:
        # Beside Cairn's own manifest.
        files = sorted(path.name for path in Path(directory).iterdir()
                       if not path.name.startswith("_cairn"))
        state: dict[str, Any] = torch.load(Path(directory, CairnReportCallback.CHECKPOINT_NAME),
                                           weights_only=False)
    state["_files"] = files
    return state


def _epochs(scratch: Path, attempt: int, rank: int) -> list[int]:
    return [int(line) for line in (scratch / f"epochs_{attempt}_{rank}.txt").read_text().split()]


@pytest.mark.slow
@pytest.mark.parametrize("upload_mode", ["SYNC", "ASYNC"])
def test_two_workers_report_a_checkpoint_every_epoch(tmp_path: Path, upload_mode: str) -> None:
    result = _fit(tmp_path, max_epochs=2, upload_mode=upload_mode)

    assert result.error is None
    for rank in (0, 1):
        assert (tmp_path / "scratch" / f"world_{rank}.txt").read_text() == "gloo 2\n"
    assert result.metrics["epoch"] == 1 and result.metrics["step"] == 8
    assert isinstance(result.metrics["train_loss"], float)
    saved = _saved(result.checkpoint)
    assert saved["_files"] == ["checkpoint.ckpt"]
    assert saved["epoch"] == 1 and saved["global_step"] == 8
    assert [metrics["epoch"] for _, metrics in result.best_checkpoints] == [0, 1]
    # Every staging directory is gone once its checkpoint is committed.
    assert os.listdir(tmp_path / "worker_tmp") == []


@pytest.mark.slow
def test_a_killed_worker_resumes_at_the_next_epoch(tmp_path: Path) -> None:
    result = _fit(tmp_path, max_epochs=3, kill_in_epoch=1)

    scratch = tmp_path / "scratch"
    assert (scratch / "killed").exists()
    assert _epochs(scratch, 0, 1) == [0, 1]
    # The second attempt resumes from the checkpoint of epoch 0: it starts at epoch 1.
    for rank in (0, 1):
        assert _epochs(scratch, 1, rank) == [1, 2]
    assert result.error is None
    assert result.metrics["epoch"] == 2 and result.metrics["step"] == 12
    assert _saved(result.checkpoint)["epoch"] == 2


@pytest.mark.slow
def test_validation_true_validates_every_epoch_checkpoint_in_the_driver(tmp_path: Path) -> None:
    result = _fit(tmp_path, max_epochs=2, validation=True,
                  validation_config=cairn.ValidationConfig(lightning_workloads.validate_checkpoint))

    assert result.error is None
    reported = [(metrics["epoch"], metrics.get("validated_epoch"))
                for _, metrics in result.best_checkpoints]
    assert reported == [(0, 0), (1, 1)]


@pytest.mark.slow
def test_local_mode_reports_and_validates_in_the_driver_and_workers_resume_from_it(
        tmp_path: Path) -> None:
    result = _fit(tmp_path, num_workers=0, max_epochs=2, validation=True,
                  validation_config=cairn.ValidationConfig(lightning_workloads.validate_checkpoint))

    assert result.error is None
    scratch = tmp_path / "scratch"
    assert (scratch / "world_0.txt").read_text() == "none 1\n"
    assert _epochs(scratch, 0, 0) == [0, 1]
    assert [(metrics["epoch"], metrics.get("validated_epoch"))
            for _, metrics in result.best_checkpoints] == [(0, 0), (1, 1)]
    # Two worker processes continue the run from the local-mode run's last checkpoint.
    resumed = _fit(tmp_path, max_epochs=3)
    for rank in (0, 1):
        assert _epochs(scratch, 1, rank) == [2]
    assert resumed.metrics["epoch"] == 2 and _saved(resumed.checkpoint)["epoch"] == 2


def test_the_ray_names_are_the_cairn_classes() -> None:
    assert RayTrainReportCallback is CairnReportCallback
    assert RayDDPStrategy is CairnDDPStrategy
    assert RayLightningEnvironment is CairnLightningEnvironment
    assert issubclass(RayFSDPStrategy, pl.strategies.FSDPStrategy)
    assert issubclass(RayDeepSpeedStrategy, pl.strategies.DeepSpeedStrategy)
    assert CairnReportCallback.CHECKPOINT_NAME == "checkpoint.ckpt"
    assert cairn.lightning.prepare_trainer is prepare_trainer


def test_the_strategy_shards_over_its_world_and_trains_on_the_worker_device() -> None:
    strategy = CairnDDPStrategy()
    assert strategy.root_device == torch.device("cpu")
    assert strategy.distributed_sampler_kwargs == {"num_replicas": 1, "rank": 0}


def test_bad_callback_arguments_name_the_argument_and_the_accepted_values() -> None:
    with pytest.raises(ConfigError, match=r"CairnReportCallback\(checkpoint_upload_mode="
                                          r"'fast'\) is not one of 'SYNC', 'ASYNC' \(a name or a "
                                          r"cairn.CheckpointUploadMode\)\.$"):
        CairnReportCallback(checkpoint_upload_mode="fast")
    with pytest.raises(ConfigError, match=r"checkpoint_upload_mode='NO_UPLOAD'\) is not "
                                          r"accepted"):
        CairnReportCallback(checkpoint_upload_mode="NO_UPLOAD")
    assert CairnReportCallback("ASYNC").checkpoint_upload_mode is cairn.CheckpointUploadMode.ASYNC


def test_a_metric_that_is_not_a_scalar_is_refused_by_name() -> None:
    class FakeTrainer:  # only what the callback reads before it saves
        callback_metrics = {"train_loss": torch.tensor(0.5), "histogram": torch.zeros(3)}
        current_epoch = 0
        global_step = 4

    with pytest.raises(ConfigError, match=r"trainer.callback_metrics\['histogram'\] is a tensor "
                                          r"of shape \(3,\); CairnReportCallback reports "
                                          r"scalars only"):
        CairnReportCallback().on_train_epoch_end(FakeTrainer(), None)


def _trainer(**kwargs: Any) -> Any:
    return pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, **kwargs)


def test_prepare_trainer_refuses_another_strategy_naming_the_accepted_ones() -> None:
    with pytest.raises(ConfigError, match=r"prepare_trainer\(trainer='trainer'\) must be a "
                                          r"Lightning Trainer, not str"):
        prepare_trainer("trainer")
    with pytest.raises(ConfigError, match=r"Trainer\(strategy=...\) is a SingleDeviceStrategy; "
                                          r"a Cairn worker group needs one of CairnDDPStrategy, "
                                          r"CairnFSDPStrategy, CairnDeepSpeedStrategy"):
        prepare_trainer(_trainer())


def test_prepare_trainer_refuses_another_cluster_environment() -> None:
    environments = pytest.importorskip(f"{pl.__name__}.plugins.environments")
    trainer = _trainer(strategy=CairnDDPStrategy(),
                       plugins=[environments.LightningEnvironment()])
    with pytest.raises(ConfigError, match=r"cluster environment is a LightningEnvironment; it "
                                          r"must be a cairn.lightning.CairnLightningEnvironment"):
        prepare_trainer(trainer)


@pytest.mark.slow
def test_prepare_trainer_without_a_process_group_says_to_use_torch_trainer(
        tmp_path: Path) -> None:
    trainer = cairn.Trainer(
        lightning_workloads.prepare_without_process_group,
        train_loop_config={"root_dir": str(tmp_path / "out")},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="plain", storage_path=str(tmp_path / "runs")),
    )
    with pytest.raises(cairn.TrainingFailedError) as failure:
        trainer.fit()
    assert failure.match(r"prepare_trainer: this run has 2 workers but torch.distributed is "
                         r"not initialized in them.*run the train function with "
                         r"cairn.torch.TorchTrainer")
