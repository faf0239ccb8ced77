"""Cairn's demo: train a small real model on 2 workers, survive a kill -9, report goodput.

    python examples/demo.py [--epochs 50] [--workers 2] [--storage ./runs/demo]

An MLP learns the handwritten digits (8x8 images in examples/data: nothing is
downloaded) on 2 worker processes joined by torch.distributed (gloo, DDP). Every epoch
each rank takes an in-memory snapshot of the whole training state (model, optimizer, LR
schedule, RNGs, data-loader position) with ``cairn.torch.report_snapshot``: the train loop
waits only for a memory copy while the upload thread serializes, uploads, verifies and
commits it. On the first attempt rank 1 is killed with SIGKILL in the middle of an epoch,
once the snapshots before it are committed (on a busy machine the last one could still be
uploading, and the restart would then begin from the one before it, or from scratch);
Cairn kills the group, restarts it and resumes from the latest committed snapshot. Then
the demo prints the result, the kept checkpoints, the test accuracy of the final
checkpoint restored in this process, and the goodput summary.

Every run gets a fresh name (``digits-<date>-<time>``) under ``--storage``, so running the
demo again starts a new run and keeps the old ones for ``cairn`` to inspect.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import cairn
from cairn import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from cairn.torch import (
    TorchTrainer,
    load_training_state,
    prepare_data_loader,
    prepare_model,
    report_snapshot,
)

# The handwritten digits: 1,797 8x8 images (pixels 0..16) and labels 0..9, exported once
# from scikit-learn's load_digits() (source and license: examples/data/README.md).
DIGITS = Path(__file__).resolve().parent / "data" / "digits.npz"
NUM_CLASSES = 10
TEST_FRACTION = 0.2
REPORT_EVERY = 10  # steps between metric-only reports


def digits_split() -> tuple[TensorDataset, TensorDataset]:
    """The digits as float tensors in [0, 1], split 80/20 in a fixed random order."""
    with numpy.load(DIGITS, allow_pickle=False) as archive:
        images, labels = archive["images"], archive["labels"]
    inputs = torch.from_numpy(images).float().reshape(len(images), -1) / 16.0
    targets = torch.from_numpy(labels).long()
    order = torch.randperm(len(inputs), generator=torch.Generator().manual_seed(0))
    test_size = int(len(inputs) * TEST_FRACTION)
    test, train = order[:test_size], order[test_size:]
    return TensorDataset(inputs[train], targets[train]), TensorDataset(inputs[test],
                                                                       targets[test])


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(64, 512), nn.ReLU(), nn.Dropout(0.1),
        nn.Linear(512, 256), nn.ReLU(), nn.Dropout(0.1),
        nn.Linear(256, NUM_CLASSES),
    )


def augment(inputs: torch.Tensor) -> torch.Tensor:
    """A little pixel noise (drawn from the torch RNG, which snapshots restore)."""
    return inputs + 0.05 * torch.randn_like(inputs)


def accuracy(model: nn.Module, dataset: TensorDataset) -> float:
    inputs, targets = dataset.tensors
    model.eval()
    with torch.no_grad():
        predicted = model(inputs).argmax(dim=1)
    model.train()
    return float((predicted == targets).float().mean())


def train_digits(config: dict[str, Any]) -> dict[str, Any]:
    """Runs in every worker."""
    context = cairn.get_context()
    rank, attempt = context.get_world_rank(), context.get_attempt()
    torch.manual_seed(0)
    train_set, test_set = digits_split()
    model = prepare_model(build_model())
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=config["epochs"])
    loader = prepare_data_loader(DataLoader(train_set, batch_size=16, shuffle=True))
    step = 0
    checkpoint = cairn.get_checkpoint()
    if checkpoint is not None:
        state = load_training_state(checkpoint, model=model, optimizer=optimizer,
                                    scheduler=scheduler, data_loader=loader)
        step = state.step
        if rank == 0:
            print(resume_line(attempt, os.path.basename(checkpoint.path), loader.epoch, step))
    handles = []
    for epoch in range(loader.epoch, config["epochs"]):
        total, batches = 0.0, 0
        for batch, (inputs, targets) in enumerate(loader):
            if (attempt, rank, epoch, batch) == (0, 1, config["crash_epoch"], 10):
                for handle in handles:  # a committed snapshot to resume from, however slow
                    handle.wait()
                print(f"injecting a crash: kill -9 of rank 1 at epoch {epoch}, batch {batch}",
                      flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            loss = nn.functional.cross_entropy(model(augment(inputs)), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total, batches, step = total + loss.item(), batches + 1, step + 1
            if step % REPORT_EVERY == 0:  # metric-only: never waits
                cairn.report({"step": step, "train_loss": loss.item()})
        scheduler.step()
        test_accuracy = accuracy(model, test_set)
        metrics = {"epoch": epoch, "step": step, "loss": total / max(batches, 1),
                   "test_accuracy": test_accuracy}
        handles.append(report_snapshot(metrics, model=model, optimizer=optimizer,
                                       scheduler=scheduler, data_loader=loader, step=step,
                                       epoch=epoch + 1))
        if rank == 0:
            print(f"epoch {epoch:2d}  loss {metrics['loss']:.4f}  "
                  f"test accuracy {test_accuracy:.4f}")
    for handle in handles:
        handle.wait()
    return {"step": step, "test_accuracy": accuracy(model, test_set)}


def resume_line(attempt: int, dir_name: str, next_epoch: int, step: int) -> str:
    """The line rank 0 prints when it resumes: the checkpoint holds the state after epoch
    ``next_epoch - 1``, the epoch its metrics (and the list of kept checkpoints) name."""
    return (f"attempt {attempt}: resumed from {dir_name} (after epoch {next_epoch - 1}, "
            f"step {step}; continuing with epoch {next_epoch})")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--crash-epoch", type=int, default=20,
                        help="epoch in which rank 1 is killed on the first attempt")
    parser.add_argument("--storage", default=os.path.join(".", "runs", "demo"))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="[%(name)s] %(message)s")
    started = time.perf_counter()
    name = time.strftime("digits-%Y%m%d-%H%M%S")
    print(f"Cairn demo: {args.workers} workers, {args.epochs} epochs, run {name!r} in "
          f"{os.path.abspath(args.storage)}")
    trainer = TorchTrainer(
        train_digits,
        train_loop_config={"epochs": args.epochs, "crash_epoch": args.crash_epoch},
        scaling_config=ScalingConfig(num_workers=args.workers),
        run_config=RunConfig(
            name=name,
            storage_path=os.path.abspath(args.storage),
            checkpoint_config=CheckpointConfig(num_to_keep=3,
                                               checkpoint_score_attribute="test_accuracy",
                                               checkpoint_score_order="max"),
            failure_config=FailureConfig(max_failures=1),
        ),
    )
    result = trainer.fit()
    print_result(result)
    print(f"\ndemo finished in {time.perf_counter() - started:.1f}s")
    return 0


def print_result(result: cairn.Result) -> None:
    goodput = result.goodput
    print("\n== result ==")
    print(f"run directory     {result.path}")
    print(f"attempts          {goodput.attempts} ({goodput.failures} failure, recovered)")
    print(f"final metrics     {format_metrics(result.metrics or {})}")
    print(f"returned by rank 0 {result.return_value}")
    print("\n== kept checkpoints, worst to best: the best 3 by test_accuracy, plus the latest "
          "and the one the last attempt resumed from ==")
    for checkpoint, metrics in result.best_checkpoints:
        print(f"  {os.path.basename(checkpoint.path)}  {format_metrics(metrics)}")
    assert result.checkpoint is not None
    result.checkpoint.verify()
    model = build_model()
    state = load_training_state(result.checkpoint, model=model, restore_rng=False)
    _, test_set = digits_split()
    print(f"\n== test accuracy ==\nlatest checkpoint {os.path.basename(result.checkpoint.path)} "
          f"(checksums verified), restored here at step {state.step}: "
          f"{accuracy(model, test_set):.4f} on {len(test_set)} held-out images")
    print("\n== goodput ==")
    print(goodput.format())


def format_metrics(metrics: dict[str, Any]) -> str:
    shown = {k: metrics[k] for k in ("epoch", "step", "loss", "test_accuracy") if k in metrics}
    return "  ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                     for k, v in shown.items())


if __name__ == "__main__":
    sys.exit(main())
