"""Train functions for the elastic tests on the Ray cluster; they run in Ray actors."""

from __future__ import annotations

import json
import os
import tempfile
import threading
from typing import Any

import ray

import cairn
from cairn import Checkpoint


def _note(config: dict[str, Any], name: str, value: object) -> None:
    path = os.path.join(config["scratch"], name)
    with open(path + ".tmp", "w") as f:
        f.write(json.dumps(value))
    os.replace(path + ".tmp", path)


def hold_in_attempts(config: dict[str, Any]) -> None:
    """One SYNC checkpoint per step; in attempt ``a`` listed in ``config["hold"]`` (a dict
    of attempt -> step), every rank stops after that step's report returned and waits
    there until the group is torn down. Each rank notes, per attempt, the step it resumed
    at, its world size, its node and its pid; with ``config["dataset"]`` it also reads its
    whole shard of the "train" dataset first and notes the ids."""
    context = cairn.get_context()
    rank, attempt = context.get_world_rank(), context.get_attempt()
    start = 0
    resumed = cairn.get_checkpoint()
    if resumed is not None:
        resumed.verify()
        with resumed.as_directory() as d, open(os.path.join(d, "rank_0.json")) as f:
            start = json.load(f)["step"] + 1
    if config.get("dataset"):
        shard = cairn.get_dataset_shard("train")
        ids = [int(i) for batch in shard.iter_batches(batch_size=4, batch_format="numpy")
               for i in batch["id"]]
        _note(config, f"shard_{attempt}_{rank}", ids)
    _note(config, f"facts_{attempt}_{rank}", {
        "resumed": start, "world_size": context.get_world_size(), "pid": os.getpid(),
        "node_id": ray.get_runtime_context().get_node_id(),
    })
    hold_at = config["hold"].get(str(attempt))
    for step in range(start, config["steps"]):
        directory = tempfile.mkdtemp()
        with open(os.path.join(directory, f"rank_{rank}.json"), "w") as f:
            json.dump({"step": step, "rank": rank}, f)
        cairn.report({"step": step, "world_size": context.get_world_size()},
                     checkpoint=Checkpoint.from_directory(directory))
        if step == hold_at:
            _note(config, f"holding_{attempt}_{rank}", step)
            threading.Event().wait()
