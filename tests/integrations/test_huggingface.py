"""cairn.huggingface: the report callback and prepare_trainer in real runs, with a kill -9
and a resume, and their argument checks."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")
pytest.importorskip("torch")

import hf_workloads

import cairn
from cairn import ConfigError, FailureConfig, RunConfig, ScalingConfig
from cairn.huggingface import CairnReportCallback, RayTrainReportCallback, prepare_trainer
from cairn.torch import TorchTrainer


def _fit(tmp_path: Path, num_workers: int = 2,
         failure_config: FailureConfig | None = None, **config: object) -> cairn.Result:
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    # The workers' temporary directory, where the callback stages each checkpoint.
    (tmp_path / "worker_tmp").mkdir(exist_ok=True)
    trainer = TorchTrainer(
        hf_workloads.train_transformers,
        train_loop_config={"output_dir": str(tmp_path / "hf_output"), "scratch": str(scratch),
                           **config},
        scaling_config=ScalingConfig(num_workers=num_workers),
        run_config=RunConfig(name="hf", storage_path=str(tmp_path / "runs"),
                             failure_config=failure_config or FailureConfig(max_failures=1),
                             worker_env={"TMPDIR": str(tmp_path / "worker_tmp")}),
    )
    return trainer.fit()


def _trainer_state(checkpoint: cairn.Checkpoint) -> dict[str, object]:
    with checkpoint.as_directory() as directory:
        hf_folder = Path(directory, CairnReportCallback.CHECKPOINT_NAME)
        names = {path.name for path in hf_folder.iterdir()}
        state: dict[str, object] = json.loads((hf_folder / "trainer_state.json").read_text())
    state["_files"] = names
    return state


def _steps(scratch: Path, attempt: int, rank: int) -> list[int]:
    return [int(line) for line in (scratch / f"steps_{attempt}_{rank}.txt").read_text().split()]


@pytest.mark.slow
@pytest.mark.parametrize("upload_mode", ["SYNC", "ASYNC"])
def test_two_workers_report_every_save_with_the_logged_metrics(
        tmp_path: Path, upload_mode: str) -> None:
    result = _fit(tmp_path, max_steps=4, save_steps=2, upload_mode=upload_mode)

    assert result.error is None
    assert "loss" in result.metrics and result.metrics["step"] == 4
    state = _trainer_state(result.checkpoint)
    assert state["global_step"] == 4
    # Rank 0's model and optimizer, each rank's own RNG state, merged into one checkpoint.
    assert {"model.safetensors", "optimizer.pt", "trainer_state.json", "rng_state_0.pth",
            "rng_state_1.pth"} <= state["_files"]
    # One report per save (steps 2 and 4), none for the logs in between (logging_steps=1).
    pytest.importorskip("pandas")
    assert list(result.metrics_dataframe["step"]) == [2, 4]
    steps = sorted(_trainer_state(c)["global_step"] for c, _ in result.best_checkpoints)
    assert steps == [2, 4]
    # Every staging directory is gone once its checkpoint is committed.
    assert sorted(os.listdir(tmp_path / "hf_output")) == ["checkpoint-2", "checkpoint-4"]
    assert os.listdir(tmp_path / "worker_tmp") == []


@pytest.mark.slow
def test_a_save_longer_than_the_collective_timeout_is_waited_for(tmp_path: Path) -> None:
    # Rank 1 reaches on_save at once, rank 0 after writing for longer than Cairn's
    # collective deadline: the barrier before staging has the process group's timeout.
    result = _fit(tmp_path, max_steps=2, save_steps=2, slow_save_s=6.0,
                  failure_config=FailureConfig(max_failures=0, collective_timeout_s=2.0))

    assert result.error is None
    assert _trainer_state(result.checkpoint)["global_step"] == 2
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= _trainer_state(result.checkpoint)["_files"]


@pytest.mark.slow
def test_a_killed_worker_resumes_the_trainer_from_the_committed_step(tmp_path: Path) -> None:
    result = _fit(tmp_path, max_steps=6, save_steps=2, kill_at_step=3)

    scratch = tmp_path / "scratch"
    assert (scratch / "killed").exists()
    assert _steps(scratch, 0, 1)[-1] == 3
    # The second attempt continues after the checkpoint of step 2, not from step 0.
    for rank in (0, 1):
        assert _steps(scratch, 1, rank) == [3, 4, 5, 6]
    assert result.error is None
    assert _trainer_state(result.checkpoint)["global_step"] == 6
    assert result.metrics["step"] == 6 and "loss" in result.metrics


@pytest.mark.slow
def test_local_mode_reports_every_save_in_the_driver_and_workers_resume_from_it(
        tmp_path: Path) -> None:
    result = _fit(tmp_path, num_workers=0, max_steps=4, save_steps=2)

    assert result.error is None
    assert _steps(tmp_path / "scratch", 0, 0) == [1, 2, 3, 4]
    state = _trainer_state(result.checkpoint)
    assert state["global_step"] == 4
    assert {"model.safetensors", "trainer_state.json", "rng_state.pth"} <= state["_files"]
    # Two worker processes continue the run from the local-mode run's step 4.
    resumed = _fit(tmp_path, max_steps=6, save_steps=2)
    for rank in (0, 1):
        assert _steps(tmp_path / "scratch", 1, rank) == [5, 6]
    assert _trainer_state(resumed.checkpoint)["global_step"] == 6


def test_the_ray_name_is_the_same_class() -> None:
    assert RayTrainReportCallback is CairnReportCallback
    assert CairnReportCallback.CHECKPOINT_NAME == "checkpoint"
    assert cairn.huggingface.prepare_trainer is prepare_trainer


def test_bad_callback_arguments_name_the_argument_and_the_accepted_values() -> None:
    with pytest.raises(ConfigError, match=r"CairnReportCallback\(checkpoint_upload_mode="
                                          r"'fast'\) is not one of 'SYNC', 'ASYNC' \(a name or a "
                                          r"cairn.CheckpointUploadMode\)\.$"):
        CairnReportCallback(checkpoint_upload_mode="fast")
    with pytest.raises(ConfigError, match=r"checkpoint_upload_mode='NO_UPLOAD'\) is not "
                                          r"accepted.*use 'SYNC' \(the default\) or 'ASYNC'"):
        CairnReportCallback(checkpoint_upload_mode="NO_UPLOAD")
    with pytest.raises(ConfigError, match=r"CairnReportCallback\(validation='yes'\) must be "
                                          r"True, False or a cairn.ValidationTaskConfig"):
        CairnReportCallback(validation="yes")  # type: ignore[arg-type]


def test_prepare_trainer_refuses_what_is_not_a_trainer() -> None:
    with pytest.raises(ConfigError, match=r"prepare_trainer\(trainer=42\) must be a "
                                          r"transformers.Trainer, not int"):
        prepare_trainer(42)


def test_prepare_trainer_warns_when_nothing_would_be_reported(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), save_strategy="no", report_to="none",
                             use_cpu=True, disable_tqdm=True)
    trainer = Trainer(model=hf_workloads.TinyRegressor(hf_workloads.TinyConfig()), args=args,
                      train_dataset=hf_workloads.LinearData())
    with caplog.at_level(logging.WARNING, logger="cairn"):
        assert prepare_trainer(trainer) is trainer
    assert "save_strategy='no'" in caplog.text

    # As Ray's: the same object, of a subclass of its class; preparing again adds none.
    prepared_class = type(trainer)
    assert isinstance(trainer, Trainer) and prepared_class is not Trainer
    caplog.clear()
    trainer.add_callback(CairnReportCallback())
    trainer.args.save_strategy = "steps"
    with caplog.at_level(logging.WARNING, logger="cairn"):
        prepare_trainer(trainer)
    assert caplog.text == ""
    assert type(trainer) is prepared_class and type(trainer).__mro__[1] is Trainer
    assert os.listdir(tmp_path) == []


@pytest.mark.slow
def test_prepare_trainer_without_a_process_group_says_to_use_torch_trainer(
        tmp_path: Path) -> None:
    trainer = cairn.Trainer(
        hf_workloads.prepare_without_process_group,
        train_loop_config={"output_dir": str(tmp_path / "out")},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="plain", storage_path=str(tmp_path / "runs")),
    )
    with pytest.raises(cairn.TrainingFailedError) as failure:
        trainer.fit()
    assert failure.match(r"prepare_trainer: this run has 2 workers but torch.distributed is "
                         r"not initialized in them.*run the train function with "
                         r"cairn.torch.TorchTrainer")


@pytest.fixture(scope="module")
def ray_instance() -> Iterator[Any]:
    """A Ray instance of this module's own on 127.0.0.1 (tests/conftest.py keeps every Ray
    node on the loopback address), as tests/controller/elastic/test_ray_datasets.py starts:
    Ray Data needs one, even for the local backend's workers."""
    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.data")
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False,
             _temp_dir=tempfile.mkdtemp(prefix="cairn-ray-"))
    yield ray
    ray.shutdown()


@pytest.mark.slow
def test_prepare_trainer_feeds_ray_data_shards_to_the_trainer(
        tmp_path: Path, ray_instance: Any) -> None:
    # Ray's pattern: train_dataset=get_dataset_shard("train").iter_torch_batches(...), an
    # iterable with no __len__; unprepared, the Trainer's map-style loader fails on len().
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    items = hf_workloads.ray_data_items()
    result = TorchTrainer(
        hf_workloads.train_on_ray_data,
        train_loop_config={"output_dir": str(tmp_path / "hf_output"), "scratch": str(scratch)},
        datasets={"train": ray_instance.data.from_items(items),
                  "eval": ray_instance.data.from_items(items[:16])},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="hf_data", storage_path=str(tmp_path / "runs")),
    ).fit()

    assert result.error is None
    for rank in (0, 1):
        assert _steps(scratch, 0, rank) == [1, 2, 3, 4]
        assert float((scratch / f"eval_{rank}.txt").read_text()) >= 0.0
    assert _trainer_state(result.checkpoint)["global_step"] == 4
    steps = sorted(_trainer_state(c)["global_step"] for c, _ in result.best_checkpoints)
    assert steps == [2, 4]


class _Untrained:
    """A Trainer mixin whose train() only records the call (the check before it is real)."""

    def train(self, *args: object, **kwargs: object) -> str:
        return "trained"


@pytest.mark.parametrize("add_after_prepare", [False, True])
def test_the_missing_callback_is_told_when_training_starts(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, add_after_prepare: bool) -> None:
    # Ray's docs add the callback either before or after prepare_trainer; only a Trainer
    # that starts training without one is warned about.
    from transformers import Trainer, TrainingArguments

    class Recorded(_Untrained, Trainer):
        pass

    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True,
                             disable_tqdm=True)
    trainer = prepare_trainer(Recorded(
        model=hf_workloads.TinyRegressor(hf_workloads.TinyConfig()), args=args,
        train_dataset=hf_workloads.LinearData()))
    with caplog.at_level(logging.WARNING, logger="cairn"):
        if add_after_prepare:
            trainer.add_callback(CairnReportCallback())
        assert trainer.train() == "trained"
    warned = "has no cairn.huggingface.CairnReportCallback" in caplog.text
    assert warned is not add_after_prepare
