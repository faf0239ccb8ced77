"""A train function for the preemption test with ``Trainer(datasets=...)``: each rank
streams its Ray Data shard first (a local worker connects to Ray for it), then trains as
:func:`preemption_workloads.just_in_time` does."""

from __future__ import annotations

import json
import os
from typing import Any

import preemption_workloads

import cairn


def read_shard_then_just_in_time(config: dict[str, Any]) -> None:
    context = cairn.get_context()
    rank, attempt = context.get_world_rank(), context.get_attempt()
    shard = cairn.get_dataset_shard("train")
    ids = [int(i) for batch in shard.iter_batches(batch_size=8) for i in batch["id"]]
    with open(os.path.join(config["scratch"], f"ids_{attempt}_{rank}"), "w") as f:
        json.dump(ids, f)
    preemption_workloads.just_in_time(config)
