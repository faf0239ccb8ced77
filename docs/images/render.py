"""Regenerate the images of docs/plots.md from a real run.

    python docs/images/render.py [OUT_DIR]

Runs a small two-worker training (a worker killed with SIGKILL mid-run, a restart, a
checkpoint every third step, ``num_to_keep=2`` so older checkpoints are deleted), then
renders ``plot.png`` (``cairn plot``) and ``goodput.png`` (``cairn goodput -o``) into
OUT_DIR (by default, this folder).
"""

from __future__ import annotations

import math
import os
import signal
import sys
import tempfile
import time
from typing import Any

import cairn
from cairn._src.cli.main import main

RUN_NAME = "demo"


def train(config: dict[str, Any]) -> None:
    """``steps`` steps, a metric report each step, a checkpoint every third step; on the
    first attempt rank ``crash_rank`` kills itself at step ``crash_step``."""
    context = cairn.get_context()
    rank, attempt = context.get_world_rank(), context.get_attempt()
    start = 0
    resumed = cairn.get_checkpoint()
    if resumed is not None:
        with resumed.as_directory() as directory:
            with open(os.path.join(directory, "step.txt")) as f:
                start = int(f.read()) + 1
    for step in range(start, config["steps"]):
        time.sleep(config["step_s"])
        if attempt == 0 and rank == config["crash_rank"] and step == config["crash_step"]:
            os.kill(os.getpid(), signal.SIGKILL)
        # A restart reshuffles the data: redone steps see other batches.
        loss = 2.0 * math.exp(-step / 6) + 0.05 + 0.03 * math.sin(step * 1.7 + attempt)
        metrics = {"step": step, "loss": loss, "lr": 0.1 * 0.9 ** step}
        if step % config["checkpoint_every"] == config["checkpoint_every"] - 1:
            directory = tempfile.mkdtemp()
            with open(os.path.join(directory, "step.txt"), "w") as f:
                f.write(str(step))
            with open(os.path.join(directory, f"weights_{rank}.bin"), "wb") as f:
                f.write(os.urandom(config["checkpoint_mib"] << 20))
            cairn.report(metrics, checkpoint=cairn.Checkpoint.from_directory(directory))
        else:
            cairn.report(metrics)


CONFIG = {"steps": 24, "step_s": 0.1, "checkpoint_every": 3, "crash_rank": 1,
          "crash_step": 14, "checkpoint_mib": 16}


def make_run(storage: str) -> str:
    """Run the demo training under ``storage``; returns the run directory."""
    cairn.Trainer(
        train, train_loop_config=CONFIG,
        scaling_config=cairn.ScalingConfig(num_workers=2),
        run_config=cairn.RunConfig(
            name=RUN_NAME, storage_path=storage,
            checkpoint_config=cairn.CheckpointConfig(num_to_keep=2),
            failure_config=cairn.FailureConfig(max_failures=2)),
    ).fit()
    return os.path.join(storage, RUN_NAME)


PLOT_ARGS = ("--metric", "loss", "--metric", "lr", "--x", "report")


def render(out_dir: str, storage: str | None = None) -> tuple[str, str]:
    """Make the demo run (under ``storage``, a fresh temporary folder by default) and draw
    ``plot.png`` and ``goodput.png`` into ``out_dir``; returns the run directory and
    ``out_dir``."""
    run = make_run(storage or tempfile.mkdtemp(prefix="cairn-demo-"))
    os.makedirs(out_dir, exist_ok=True)
    for argv in (["plot", run, *PLOT_ARGS, "-o", os.path.join(out_dir, "plot.png")],
                 ["goodput", run, "-o", os.path.join(out_dir, "goodput.png")]):
        if main(argv) != 0:
            raise SystemExit(f"cairn {' '.join(argv)} failed")
    return run, out_dir


if __name__ == "__main__":
    os.environ.setdefault("CAIRN_PROGRESS", "0")
    render(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))
