"""A tiny Lightning module, data and train function the cairn.lightning tests run in real
worker processes (nothing is downloaded)."""

from __future__ import annotations

import os
import signal
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import cairn

try:
    import lightning.pytorch as pl
except ModuleNotFoundError:
    import pytorch_lightning as pl  # type: ignore[no-redef]


class TinyRegressor(pl.LightningModule):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_index: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.linear(x).squeeze(-1), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def data() -> DataLoader[Any]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=generator)
    y = x @ torch.randn(4, generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=4)


class RecordEpochs(pl.Callback):  # type: ignore[misc]
    """Appends every epoch this rank starts to ``epochs_<attempt>_<rank>.txt``; with
    ``kill_in_epoch``, rank 1 of the first attempt SIGKILLs itself after the first batch of
    that epoch, once (a marker file says it happened)."""

    def __init__(self, scratch: str, kill_in_epoch: int | None) -> None:
        self.scratch = scratch
        self.kill_in_epoch = kill_in_epoch

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        context = cairn.get_context()
        name = f"epochs_{context.get_attempt()}_{context.get_world_rank()}.txt"
        with open(os.path.join(self.scratch, name), "a") as f:
            f.write(f"{trainer.current_epoch}\n")

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_index: int) -> None:
        marker = os.path.join(self.scratch, "killed")
        if (trainer.current_epoch == self.kill_in_epoch and trainer.global_rank == 1
                and not os.path.exists(marker)):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)


def validate_checkpoint(checkpoint: cairn.Checkpoint) -> dict[str, Any]:
    """The validation function (it runs in the driver): the epoch the checkpoint holds."""
    with checkpoint.as_directory() as directory:
        state = torch.load(os.path.join(directory, "checkpoint.ckpt"), weights_only=False)
    return {"validated_epoch": state["epoch"]}


def train_lightning(config: dict[str, Any]) -> None:
    """Ray Train's documented Lightning pattern, with `ray.train.lightning` ported to
    `cairn.lightning` (imported here, in the worker)."""
    import cairn.lightning
    from cairn.lightning import (
        RayDDPStrategy,
        RayLightningEnvironment,
        RayTrainReportCallback,
        prepare_trainer,
    )

    torch.set_num_threads(1)
    context = cairn.get_context()
    with open(os.path.join(config["scratch"], f"world_{context.get_world_rank()}.txt"),
              "w") as f:
        # Local mode (num_workers=0) forms no process group before Lightning does.
        f.write(f"{torch.distributed.get_backend()} {torch.distributed.get_world_size()}\n"
                if torch.distributed.is_initialized() else "none 1\n")
    trainer = pl.Trainer(
        max_epochs=config["max_epochs"],
        accelerator="cpu",
        devices="auto",
        strategy=RayDDPStrategy(),
        plugins=[RayLightningEnvironment()],
        callbacks=[RayTrainReportCallback(config.get("upload_mode", "SYNC"),
                                          validation=config.get("validation", False)),
                   RecordEpochs(config["scratch"], config.get("kill_in_epoch"))],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
        default_root_dir=config["root_dir"],
    )
    trainer = prepare_trainer(trainer)
    assert isinstance(trainer.strategy, cairn.lightning.CairnDDPStrategy)
    checkpoint = cairn.get_checkpoint()
    if checkpoint is None:
        trainer.fit(TinyRegressor(), train_dataloaders=data())
        return
    with checkpoint.as_directory() as directory:
        trainer.fit(TinyRegressor(), train_dataloaders=data(),
                    ckpt_path=os.path.join(directory, RayTrainReportCallback.CHECKPOINT_NAME))


def prepare_without_process_group(config: dict[str, Any]) -> None:
    """prepare_trainer in a plain cairn.Trainer worker, where torch.distributed is not set up."""
    from cairn.lightning import RayDDPStrategy, RayLightningEnvironment, prepare_trainer

    trainer = pl.Trainer(accelerator="cpu", devices="auto", strategy=RayDDPStrategy(),
                         plugins=[RayLightningEnvironment()], logger=False,
                         enable_checkpointing=False, default_root_dir=config["root_dir"])
    prepare_trainer(trainer)
