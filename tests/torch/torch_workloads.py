"""Training functions the cairn.torch tests run in real worker processes."""

from __future__ import annotations

import json
import os
import random
import signal
import tempfile
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import cairn
from cairn import Checkpoint, CheckpointUploadMode
from cairn.torch import (
    get_device,
    load_training_state,
    prepare_data_loader,
    prepare_model,
    report_snapshot,
    save_training_state,
)


def _write_json(path: str, value: Any) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(value, f)
    os.replace(path + ".tmp", path)


def allreduce_until_killed(config: dict[str, Any]) -> list[float]:
    """All-reduces every step; on the first attempt rank 1 is SIGKILLed at ``kill_step``
    while rank 0 waits for it inside an all_reduce."""
    context = cairn.get_context()
    rank, attempt = context.get_world_rank(), context.get_attempt()
    names = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
             "LOCAL_WORLD_SIZE")
    _write_json(os.path.join(config["scratch"], f"env_{attempt}_{rank}.json"), {
        **{name: os.environ.get(name) for name in names},
        "initialized": dist.is_initialized(),
        "backend": dist.get_backend() if dist.is_initialized() else None,
        "device": str(get_device()),
    })
    sums = []
    for step in range(config["steps"]):
        if attempt == 0 and rank == 1 and step == config["kill_step"]:
            time.sleep(0.2)  # rank 0 is inside the all_reduce of this step by now
            os.kill(os.getpid(), signal.SIGKILL)
        value = torch.tensor([float(rank + 1 + step)])
        dist.all_reduce(value)
        sums.append(float(value))
    return sums


def ddp_and_sharding(config: dict[str, Any]) -> None:
    """prepare_model wraps in DDP; prepare_data_loader shards and reshuffles per epoch."""
    rank = cairn.get_context().get_world_rank()
    torch.manual_seed(rank)  # different on each rank: DDP must broadcast rank 0's weights
    model = prepare_model(nn.Linear(3, 1))
    loader = prepare_data_loader(DataLoader(TensorDataset(torch.arange(16)), batch_size=4,
                                            shuffle=True))
    epochs = [[int(i) for batch in loader for i in batch[0]] for _ in range(2)]
    weights = model.module.weight.detach().clone()
    gathered = [torch.zeros_like(weights) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, weights)
    _write_json(os.path.join(config["scratch"], f"shard_{rank}.json"), {
        "ddp": isinstance(model, nn.parallel.DistributedDataParallel),
        "epochs": epochs,
        "same_weights": all(torch.equal(g, gathered[0]) for g in gathered),
        "batches": len(loader),
    })


# --- exact resume ------------------------------------------------------------------------


def _data() -> TensorDataset:
    generator = torch.Generator().manual_seed(1234)  # never the global RNG
    inputs = torch.randn(64, 8, generator=generator)
    labels = (inputs.sum(dim=1) > 0).long()
    return TensorDataset(inputs, labels)


def exact_resume(config: dict[str, Any]) -> dict[str, Any]:
    """A small DDP model with dropout and random augmentation (Python, NumPy and torch
    RNGs), checkpointed every ``every`` steps; returns rank 0's final state."""
    context = cairn.get_context()
    rank, attempt = context.get_world_rank(), context.get_attempt()
    torch.manual_seed(0)
    random.seed(rank)
    np.random.seed(rank)
    model = prepare_model(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2),
                                        nn.Linear(16, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.5)
    loader = prepare_data_loader(DataLoader(_data(), batch_size=4, shuffle=True), seed=3)
    step = 0
    checkpoint = cairn.get_checkpoint()
    if checkpoint is not None:
        state = load_training_state(checkpoint, model=model, optimizer=optimizer,
                                    scheduler=scheduler, data_loader=loader)
        step = state.step
        _write_json(os.path.join(config["scratch"], f"resumed_{attempt}_{rank}.json"),
                    {"step": step, "position": state.data_loader_position})
    handles: list[cairn.ReportHandle] = []
    for _ in range(loader.epoch, config["epochs"]):
        for inputs, labels in loader:
            noise = random.random() * 0.01 + float(np.random.rand()) * 0.01
            inputs = inputs + noise * torch.randn_like(inputs)
            loss = nn.functional.cross_entropy(model(inputs), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            step += 1
            if step % config["every"] == 0:
                handles.append(_checkpoint(config, model, optimizer, scheduler, loader, step,
                                           float(loss)))
            if attempt == 0 and rank == config.get("crash_rank") and step == config.get(
                "crash_step"
            ):
                for handle in handles:
                    handle.wait()  # the resume is from a committed checkpoint, not scratch
                os.kill(os.getpid(), signal.SIGKILL)
    for handle in handles:
        handle.wait()
    final = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    return {
        "step": step,
        "model": {k: v.clone() for k, v in final.state_dict().items()},
        "momentum": [optimizer.state[p]["momentum_buffer"].clone()
                     for p in final.parameters()],
        "next_draw": torch.rand(2),
    }


def _checkpoint(config: dict[str, Any], model: nn.Module, optimizer: Any, scheduler: Any,
                loader: Any, step: int, loss: float) -> cairn.ReportHandle:
    metrics = {"step": step, "loss": loss}
    if config["mode"] == "snapshot":
        return report_snapshot(metrics, model=model, optimizer=optimizer, scheduler=scheduler,
                               data_loader=loader, step=step)
    with tempfile.TemporaryDirectory() as directory:
        save_training_state(directory, model=model, optimizer=optimizer, scheduler=scheduler,
                            data_loader=loader, step=step)
        return cairn.report(metrics, checkpoint=Checkpoint.from_directory(directory),
                            checkpoint_upload_mode=CheckpointUploadMode.SYNC)


# --- snapshot forms ----------------------------------------------------------------------


def snapshot_forms(config: dict[str, Any]) -> dict[str, Any]:
    """A plain state dict (rank 0), one per rank, and argument errors caught in place."""
    rank = cairn.get_context().get_world_rank()
    weights = torch.full((3, 2), float(rank))
    errors = []
    for bad in (
        lambda: report_snapshot({"x": 1}),
        lambda: report_snapshot({"x": 1}, {"w": weights}, model=nn.Linear(1, 1)),
        lambda: report_snapshot({"x": 1}, {"w": weights}, file_name="a/b.pt"),
    ):
        try:
            bad()
        except cairn.ReportError as exc:
            errors.append(str(exc))
    shared = report_snapshot({"form": 0}, {"w": weights, "step": 1})
    weights.add_(10.0)  # after the call returns, training may change the live tensors
    own = report_snapshot({"form": 1}, {"w": weights}, per_rank=True, file_name="mine.pt",
                          checkpoint_dir_name="per_rank")
    committed = [shared.wait(), own.wait()]
    files: dict[str, Any] = {}
    for checkpoint in committed:
        if checkpoint is None:
            continue
        with checkpoint.as_directory() as directory:
            for root, _, names in os.walk(directory):
                for name in names:
                    if name.endswith(".pt"):
                        path = os.path.join(root, name)
                        files[os.path.relpath(path, directory)] = torch.load(path)
    return {"errors": errors, "files": files, "shared_has_checkpoint": shared.has_checkpoint}


def snapshot_with_no_temporary_directory(config: dict[str, Any]) -> bool:
    """A snapshot serialized straight into storage needs no private temporary directory:
    with the temporary directory pointing nowhere, it still commits."""
    tempfile.tempdir = config["missing"]
    try:
        handle = report_snapshot({"step": 1}, {"w": torch.ones(3)})
        return handle.wait() is not None
    finally:
        tempfile.tempdir = None


def dcp_save_by_reference(config: dict[str, Any]) -> None:
    """Two DCP saves with cairn.torch.FileSystemWriter, each registered by reference:
    ``config["route"]`` "no_upload" (a NO_UPLOAD report of ``writer.checkpoint()`` after
    the save) or "upload_fn" (``async_save``, then an ASYNC report whose upload function
    waits for the save and returns ``writer.checkpoint()``)."""
    import torch.distributed.checkpoint as dcp

    from cairn.torch import FileSystemWriter

    torch.manual_seed(0)
    state = {"w": torch.randn(128, 32), "step": 0}
    for step in (1, 2):
        state["step"] = step
        writer = FileSystemWriter(os.path.join(config["root"], f"step_{step}"))
        if config["route"] == "no_upload":
            dcp.save(state, storage_writer=writer)
            cairn.report({"step": step}, checkpoint=writer.checkpoint(),
                         checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD)
            continue
        future = dcp.async_save(state, storage_writer=writer)

        def registered(checkpoint: Any, dir_name: str, future: Any = future,
                       writer: Any = writer) -> Any:
            future.result()
            return writer.checkpoint()

        cairn.report({"step": step}, checkpoint=writer.checkpoint(),
                     checkpoint_upload_mode=CheckpointUploadMode.ASYNC,
                     checkpoint_upload_fn=registered).wait()
