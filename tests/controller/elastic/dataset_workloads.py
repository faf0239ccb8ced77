"""Train functions that read Ray Data shards, run by Ray actors in the dataset tests."""

from __future__ import annotations

import json
import os
from typing import Any

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
        json.dump({"ids": ids, "world_size": context.get_world_size()}, f)
    cairn.report({"rows": len(ids)})
    if rank == 1 and attempt == 0 and config.get("crash"):
        os._exit(1)
