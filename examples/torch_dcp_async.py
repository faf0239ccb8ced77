"""Your own async checkpointing, Cairn's bookkeeping: ``torch.distributed.checkpoint``.

    python examples/torch_dcp_async.py [--mode upload-fn|no-upload] [--steps 30]
                                       [--every 5] [--crash-at 17] [--storage DIR]

The train loop saves with ``dcp.async_save`` (DCP stages the state in CPU memory, then
every rank writes its shard in a background thread). DCP writes the checkpoint directory
itself, next to the run; Cairn never copies it, it *registers* it: a manifest in the run
directory with every file's size and checksum, retention, ``get_checkpoint()`` after a
restart. The save goes through ``cairn.torch.FileSystemWriter``, DCP's own writer that
checksums each file as it writes it, so the commit reads nothing again. Two ways to hand
it over:

* ``--mode upload-fn`` (default): ``report(..., checkpoint_upload_mode=ASYNC,
  checkpoint_upload_fn=fn)`` at the step of the save. ``fn`` runs on Cairn's upload
  thread, waits for the DCP future there and returns the directory DCP wrote: the train
  loop never waits for the write.
* ``--mode no-upload``: before the next save (and at the end) the loop waits for the
  previous future, then reports that directory with ``checkpoint_upload_mode=NO_UPLOAD``.

Either way a save waits for the one before it (DCP runs one save at a time per process
group), so the loop blocks only when a save takes longer than ``--every`` steps.

Rank 1 is killed (SIGKILL) at step ``--crash-at`` of the first attempt; the restarted
group loads the latest committed checkpoint with ``dcp.load`` and finishes (a save the
crash interrupted was never committed: Cairn ignores its directory, and deletes only
directories it registered). Runs on CPUs
with 2 workers (gloo); DCP's background collectives use a separate gloo group, so they
never interleave with DDP's on the default one.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

import cairn
from cairn import (
    Checkpoint,
    CheckpointConfig,
    CheckpointUploadMode,
    FailureConfig,
    RunConfig,
    ScalingConfig,
)
from cairn.torch import FileSystemWriter, TorchTrainer, prepare_model


class AppState(Stateful):
    """Model, optimizer and step in DCP's Stateful form (DCP calls these on save/load)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer, self.step = model, optimizer, 0

    def state_dict(self) -> dict[str, Any]:
        model_state, optimizer_state = get_state_dict(self.model, self.optimizer)
        return {"model": model_state, "optimizer": optimizer_state, "step": self.step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=state_dict["model"],
                       optim_state_dict=state_dict["optimizer"])
        self.step = int(state_dict["step"])


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(step * 100 + rank)
    inputs = torch.randn(32, 16, generator=generator)
    return inputs, inputs.sum(dim=1, keepdim=True)


def train_func(config: dict[str, Any]) -> dict[str, Any]:
    context = cairn.get_context()
    rank, attempt = context.get_world_rank(), context.get_attempt()
    torch.manual_seed(0)
    model = prepare_model(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    state = {"app": AppState(model, optimizer)}
    checkpoint_group = dist.new_group(backend="gloo")  # for DCP's background thread
    resumed = cairn.get_checkpoint()
    if resumed is not None:
        with resumed.as_directory() as directory:
            dcp.load(state, checkpoint_id=directory)
        if rank == 0:
            print(f"attempt {attempt}: resumed at step {state['app'].step} from {resumed.path}")
    root = os.path.join(config["dcp_root"], f"attempt_{attempt}")
    in_flight: tuple[Any, FileSystemWriter, dict[str, Any]] | None = None  # the save running
    handles = []
    loss = torch.zeros(())
    for step in range(state["app"].step, config["steps"]):
        if (attempt, rank, step) == (0, 1, config["crash_at"]):
            # The first checkpoint commits before the crash (the restart resumes from it,
            # however slow the machine); a later save may still be running.
            if handles:
                handles[0].wait()
            print(f"injecting a crash: kill -9 of rank 1 at step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        inputs, targets = batch(step, rank)
        loss = nn.functional.mse_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        state["app"].step = step + 1
        if (step + 1) % config["every"] != 0:
            continue
        if in_flight is not None:
            # One DCP save at a time: two would interleave their collectives.
            finish(in_flight, config["mode"], handles)
        path = os.path.join(root, f"step_{step + 1:06d}")
        metrics = {"step": step + 1, "loss": loss.item()}
        # Cairn's FileSystemWriter is DCP's, checksumming each file as it writes it: the
        # commit takes those checksums instead of reading the checkpoint again.
        writer = FileSystemWriter(path)
        future = dcp.async_save(state, storage_writer=writer, process_group=checkpoint_group)
        in_flight = (future, writer, metrics)
        if config["mode"] == "upload-fn":
            handles.append(cairn.report(
                metrics,
                checkpoint=Checkpoint(path),
                checkpoint_upload_mode=CheckpointUploadMode.ASYNC,
                checkpoint_upload_fn=WaitForSave(future, writer),
                # The "local copy" is the directory DCP writes, which is what gets kept.
                delete_local_checkpoint_after_upload=False,
            ))
    if in_flight is not None:
        finish(in_flight, config["mode"], handles)
    for handle in handles:
        handle.wait()
    return {"step": state["app"].step, "loss": loss.item()}


class WaitForSave:
    """A ``checkpoint_upload_fn``: on Cairn's upload thread, wait until DCP has written
    the directory (every rank's shard, and the metadata on rank 0), then hand it over with
    the checksums this rank's writer computed."""

    def __init__(self, future: Any, writer: FileSystemWriter) -> None:
        self.future, self.writer = future, writer

    def __call__(self, checkpoint: Checkpoint, dir_name: str) -> Checkpoint:
        self.future.result()
        return self.writer.checkpoint()


def finish(in_flight: tuple[Any, FileSystemWriter, dict[str, Any]], mode: str,
           handles: list[cairn.ReportHandle]) -> None:
    """Wait for the save in flight; with NO_UPLOAD, report its directory now."""
    future, writer, metrics = in_flight
    future.result()
    if mode == "no-upload":
        # Rank 0 writes DCP's metadata last: every rank reports a finished directory.
        dist.barrier()
        handles.append(cairn.report(metrics, checkpoint=writer.checkpoint(),
                                    checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("upload-fn", "no-upload"), default="upload-fn")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--crash-at", type=int, default=17)
    parser.add_argument("--storage", default=os.path.join(".", "runs", "dcp"))
    args = parser.parse_args(argv)
    storage = os.path.abspath(args.storage)
    name = time.strftime("dcp-%Y%m%d-%H%M%S")
    result = TorchTrainer(
        train_func,
        train_loop_config={"mode": args.mode, "steps": args.steps, "every": args.every,
                           "crash_at": args.crash_at,
                           "dcp_root": os.path.join(storage, f"{name}-dcp")},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name=name,
            storage_path=storage,
            # DCP's directories live outside the run directory: retention deletes the
            # ones it drops only with delete_unmanaged_checkpoints=True.
            checkpoint_config=CheckpointConfig(num_to_keep=2,
                                               delete_unmanaged_checkpoints=True),
            failure_config=FailureConfig(max_failures=1),
        ),
    ).fit()
    print(f"mode {args.mode}: finished at step {result.return_value['step']}, "
          f"loss {result.return_value['loss']:.4f}")
    for checkpoint, metrics in result.best_checkpoints:
        checkpoint.verify()
        print(f"  kept (verified) {checkpoint.path}: step {metrics['step']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
