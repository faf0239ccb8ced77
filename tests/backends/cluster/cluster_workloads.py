"""Training functions for the Ray cluster tests; they run in Ray actors on the nodes."""

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


def placement_facts(config: dict[str, Any]) -> None:
    """Each rank records what its context says and where Ray really runs it."""
    context = cairn.get_context()
    rank = context.get_world_rank()
    _note(config, f"placement_{rank}", {
        "node_id": ray.get_runtime_context().get_node_id(),
        "world_size": context.get_world_size(),
        "local_rank": context.get_local_rank(),
        "local_world_size": context.get_local_world_size(),
        "node_rank": context.get_node_rank(),
        "env": [os.environ.get(name) for name in
                ("CAIRN_RANK", "CAIRN_LOCAL_RANK", "CAIRN_LOCAL_WORLD_SIZE")],
    })


def hold_after(config: dict[str, Any]) -> None:
    """One SYNC checkpoint per step; in attempt 0 every rank stops after step
    ``hold_at``'s report returned and waits there until the group is torn down."""
    context = cairn.get_context()
    rank, attempt = context.get_world_rank(), context.get_attempt()
    start = 0
    resumed = cairn.get_checkpoint()
    if resumed is not None:
        resumed.verify()
        with resumed.as_directory() as d, open(os.path.join(d, "rank_0.json")) as f:
            start = json.load(f)["step"] + 1
    _note(config, f"resumed_{attempt}_{rank}", start)
    _note(config, f"node_{attempt}_{rank}", ray.get_runtime_context().get_node_id())
    for step in range(start, config["steps"]):
        directory = tempfile.mkdtemp()
        with open(os.path.join(directory, f"rank_{rank}.json"), "w") as f:
            json.dump({"step": step, "rank": rank}, f)
        handle = cairn.report({"step": step}, checkpoint=Checkpoint.from_directory(directory))
        if rank == 0 and handle.error is None:
            _note(config, f"sync_returned_{step}", handle.index)
        if attempt == 0 and step == config["hold_at"]:
            _note(config, f"holding_{rank}", step)
            threading.Event().wait()


def torch_rendezvous(config: dict[str, Any]) -> None:
    """Under ``TorchTrainer``: each rank records the rendezvous it joined, its node and the
    sum of an all_reduce over the ranks."""
    import torch
    import torch.distributed as dist

    rank = cairn.get_context().get_world_rank()
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    _note(config, f"rendezvous_{rank}", {
        "master": [os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]],
        "node_address": os.environ["CAIRN_NODE_ADDRESS"],
        "node_id": ray.get_runtime_context().get_node_id(),
        "sum": float(total),
    })
