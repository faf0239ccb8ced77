from __future__ import annotations

import os
import tempfile
import time
from typing import Any

import cairn


def train(config: dict[str, Any]) -> None:
    for step in range(config["steps"]):
        d = tempfile.mkdtemp()
        with open(os.path.join(d, "state.txt"), "w") as f:
            f.write(str(step))
        cairn.report({"step": step, "loss": 1.0 / (step + 1)},
                     checkpoint=cairn.Checkpoint.from_directory(d))


def fail_on_rank_one(config: dict[str, Any]) -> None:
    """Reports a checkpoint, then rank 1 raises ValueError."""
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "state.txt"), "w") as f:
            f.write("0")
        cairn.report({"step": 0, "loss": 1.0}, checkpoint=cairn.Checkpoint.from_directory(tmp))
    if cairn.get_context().get_world_rank() == 1:
        raise ValueError("rank one gives up")


def checkpoint_then_wait(config: dict[str, Any]) -> None:
    """Reports ``steps`` checkpoints, then waits in the train loop until the file
    ``config["release"]`` exists (or the driver that started this worker is gone)."""
    train({"steps": config["steps"]})
    driver = os.getppid()
    while not os.path.exists(config["release"]) and os.getppid() == driver:
        time.sleep(0.02)


def three_files(config: dict[str, Any]) -> None:
    """One checkpoint of three files, ``a``, ``b`` and ``c``."""
    with tempfile.TemporaryDirectory() as tmp:
        for name in "abc":
            with open(os.path.join(tmp, name), "w") as f:
                f.write(name * 10)
        cairn.report({"step": 0}, checkpoint=cairn.Checkpoint.from_directory(tmp))


def checkpoint_until_lease_gone(config: dict[str, Any]) -> None:
    """Reports two checkpoints, waits until the run's lease file ``config["lease"]`` is
    gone (broken by hand), then reports a third checkpoint, which the driver must refuse."""
    train({"steps": 2})
    driver = os.getppid()
    while os.path.exists(config["lease"]) and os.getppid() == driver:
        time.sleep(0.02)
    train({"steps": 1})


# val/loss of each step: the best two (lowest) are steps 1 and 3, neither the latest.
NESTED_LOSSES = (0.5, 0.2, 0.9, 0.3, 0.8)


def nested_metrics(config: dict[str, Any]) -> None:
    """A checkpoint per step with nested metrics: ``{"step": s, "val": {"loss": ...}}``."""
    for step, loss in enumerate(NESTED_LOSSES):
        d = tempfile.mkdtemp()
        with open(os.path.join(d, "state.txt"), "w") as f:
            f.write(str(step))
        cairn.report({"step": step, "val": {"loss": loss, "acc": 1.0 - loss}},
                     checkpoint=cairn.Checkpoint.from_directory(d))
