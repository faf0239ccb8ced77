"""A tiny Hugging Face model, data set and train function the cairn.huggingface tests run
in real worker processes (nothing is downloaded)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset
from transformers import (
    PretrainedConfig,
    PreTrainedModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

import cairn


class TinyConfig(PretrainedConfig):  # type: ignore[misc]
    model_type = "cairn-tiny-regressor"

    def __init__(self, features: int = 4, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.features = features


class TinyRegressor(PreTrainedModel):  # type: ignore[misc]
    config_class = TinyConfig

    def __init__(self, config: TinyConfig) -> None:
        super().__init__(config)
        self.linear = nn.Linear(config.features, 1)
        self.post_init()

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, Any]:
        prediction = self.linear(x).squeeze(-1)
        loss = None if labels is None else nn.functional.mse_loss(prediction, labels)
        return {"loss": loss, "logits": prediction}


class LinearData(Dataset[dict[str, torch.Tensor]]):
    """``y = x @ w`` for fixed random ``x`` and ``w``, in memory."""

    def __init__(self, size: int = 32, features: int = 4) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(size, features, generator=generator)
        self.y = self.x @ torch.randn(features, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[index], "labels": self.y[index]}


class RecordSteps(TrainerCallback):  # type: ignore[misc]
    """Appends every global step this rank finishes to ``steps_<attempt>_<rank>.txt``;
    with ``kill_at_step``, rank 1 of the first attempt SIGKILLs itself at that step, once
    (a marker file says it happened)."""

    def __init__(self, scratch: str, kill_at_step: int | None) -> None:
        self.scratch = scratch
        self.kill_at_step = kill_at_step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        context = cairn.get_context()
        rank, attempt = context.get_world_rank(), context.get_attempt()
        with open(os.path.join(self.scratch, f"steps_{attempt}_{rank}.txt"), "a") as f:
            f.write(f"{state.global_step}\n")
        marker = os.path.join(self.scratch, "killed")
        if (self.kill_at_step == state.global_step and rank == 1
                and not os.path.exists(marker)):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)


class SlowSave(TrainerCallback):  # type: ignore[misc]
    """Rank 0 takes ``seconds`` more to save (a large model on slow storage), before the
    report callback's barrier."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if cairn.get_context().get_world_rank() == 0:
            time.sleep(self.seconds)


def train_transformers(config: dict[str, Any]) -> None:
    """The ported Ray Train pattern: the callback reports each save; a restart resumes the
    Trainer from the reported checkpoint's ``checkpoint/`` folder."""
    torch.set_num_threads(1)
    # Through the attribute, as a ported `ray.train.huggingface.transformers.X` call would:
    # the worker never imported cairn.huggingface itself.
    huggingface = cairn.huggingface
    args = TrainingArguments(
        output_dir=config["output_dir"],
        per_device_train_batch_size=4,
        max_steps=config["max_steps"],
        save_strategy="steps",
        save_steps=config["save_steps"],
        logging_steps=1,
        learning_rate=0.05,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    trainer = Trainer(
        model=TinyRegressor(TinyConfig()),
        args=args,
        train_dataset=LinearData(),
        callbacks=[
            *([SlowSave(config["slow_save_s"])] if "slow_save_s" in config else []),
            huggingface.RayTrainReportCallback(
                checkpoint_upload_mode=config.get("upload_mode", "SYNC")),
            RecordSteps(config["scratch"], config.get("kill_at_step")),
        ],
    )
    trainer = huggingface.prepare_trainer(trainer)
    checkpoint = cairn.get_checkpoint()
    if checkpoint is None:
        trainer.train()
        return
    with checkpoint.as_directory() as directory:
        trainer.train(resume_from_checkpoint=os.path.join(
            directory, huggingface.RayTrainReportCallback.CHECKPOINT_NAME))


def prepare_without_process_group(config: dict[str, Any]) -> None:
    """prepare_trainer in a plain cairn.Trainer worker, where torch.distributed is not set up."""
    args = TrainingArguments(output_dir=config["output_dir"], report_to="none", use_cpu=True,
                             disable_tqdm=True)
    trainer = Trainer(model=TinyRegressor(TinyConfig()), args=args, train_dataset=LinearData())
    cairn.huggingface.prepare_trainer(trainer)


def ray_data_items(size: int = 32, features: int = 4) -> list[dict[str, Any]]:
    """LinearData's rows as Ray Data items."""
    data = LinearData(size, features)
    return [{"x": data.x[i].tolist(), "labels": float(data.y[i])} for i in range(size)]


def train_on_ray_data(config: dict[str, Any]) -> None:
    """Ray's Ray Data pattern: the Trainer's train_dataset is this rank's shard as an
    iterable of torch batches (no __len__), which prepare_trainer makes the Trainer read."""
    torch.set_num_threads(1)
    dtypes = {"x": torch.float32, "labels": torch.float32}
    shard = cairn.get_dataset_shard("train")
    args = TrainingArguments(
        output_dir=config["output_dir"], max_steps=4, save_strategy="steps", save_steps=2,
        logging_steps=1, learning_rate=0.05, report_to="none", use_cpu=True,
        disable_tqdm=True, seed=0,
    )
    trainer = Trainer(
        model=TinyRegressor(TinyConfig()),
        args=args,
        train_dataset=shard.iter_torch_batches(batch_size=4, dtypes=dtypes),
        eval_dataset={"a": cairn.get_dataset_shard("eval").iter_torch_batches(
            batch_size=4, dtypes=dtypes)},
        callbacks=[cairn.huggingface.RayTrainReportCallback(),
                   RecordSteps(config["scratch"], None)],
    )
    trainer = cairn.huggingface.prepare_trainer(trainer)
    trainer.train()
    metrics = trainer.evaluate()
    rank = cairn.get_context().get_world_rank()
    with open(os.path.join(config["scratch"], f"eval_{rank}.txt"), "w") as f:
        f.write(str(metrics["eval_a_loss"]))
