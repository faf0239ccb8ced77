"""Training functions for the blame-the-cause tests (real gloo process groups)."""

from __future__ import annotations

import os
import time
from typing import Any

import torch
import torch.distributed as dist

import cairn


def exit_inside_allreduce(config: dict[str, Any]) -> None:
    """All-reduces every step; rank 1 leaves with ``os._exit`` at ``exit_step`` while rank 0
    waits for it inside the all_reduce of that step."""
    rank = cairn.get_context().get_world_rank()
    for step in range(config["steps"]):
        if rank == 1 and step == config["exit_step"]:
            time.sleep(0.3)  # rank 0 is inside the all_reduce of this step by now
            os._exit(3)
        value = torch.tensor([float(rank + step)])
        dist.all_reduce(value)
        cairn.report({"step": step, "sum": float(value)})
