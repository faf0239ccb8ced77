"""Train functions that read Ray Data shards, run by Ray actors in the dataset tests."""

from __future__ import annotations

import json
import os
from typing import Any

import ray

import cairn


def read_shard(config: dict[str, Any]) -> None:
    """Each rank records the ids of its shard; rank 1 may die in the first attempt."""
    context = cairn.get_context()
    rank, attempt = context.get_world_rank(), context.get_attempt()
    shard = cairn.get_dataset_shard(config.get("name", "train"))
    ids = [int(row["id"]) for batch in shard.iter_batches(batch_size=4, batch_format="numpy")
           for row in ({"id": i} for i in batch["id"])]
    path = os.path.join(config["scratch"], f"attempt_{attempt}_rank_{rank}.json")
    with open(path, "w") as f:
        json.dump({"ids": ids, "world_size": context.get_world_size(),
                   "ray_address": ray.get_runtime_context().gcs_address}, f)
    cairn.report({"rows": len(ids)})
    if rank == 1 and attempt == 0 and config.get("crash"):
        os._exit(1)


def read_every_dataset(config: dict[str, Any]) -> None:
    """Each rank records, for every dataset named in the config, the ids it streamed in
    each of two epochs, and the Ray Data setting the driver set before building the
    Trainer."""
    from ray.data import DataContext

    context = cairn.get_context()
    rank, attempt = context.get_world_rank(), context.get_attempt()
    seen: dict[str, Any] = {}
    for name in config["names"]:
        shard = cairn.get_dataset_shard(name)
        seen[name] = [sorted(int(i) for batch in shard.iter_batches(batch_size=4)
                             for i in batch["id"]) for _ in range(2)]
    seen["marker"] = DataContext.get_current().get_config("cairn_test_marker", None)
    with open(os.path.join(config["scratch"], f"attempt_{attempt}_rank_{rank}.json"),
              "w") as f:
        json.dump(seen, f)
    cairn.report({"rank": rank})
