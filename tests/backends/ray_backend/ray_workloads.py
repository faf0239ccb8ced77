from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import cairn

# The attempts whose train function ran in this process (a kept survivor runs several).
_ATTEMPTS_HERE: list[int] = []


def train(config: dict[str, Any]) -> dict[str, Any]:
    context = cairn.get_context()
    rank = context.get_world_rank()
    _ATTEMPTS_HERE.append(context.get_attempt())
    start = 0
    checkpoint = cairn.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d, open(os.path.join(d, "rank_0.json")) as f:
            start = json.load(f)["step"] + 1
    for step in range(start, config["steps"]):
        d = tempfile.mkdtemp()
        with open(os.path.join(d, f"rank_{rank}.json"), "w") as f:
            json.dump({"step": step}, f)
        cairn.report({"step": step}, checkpoint=cairn.Checkpoint.from_directory(d))
        if config.get("crash_at") == step and rank == 1 and context.get_attempt() == 0:
            os._exit(1)
    return {"start": start, "local_rank": context.get_local_rank(),
            "local_world_size": context.get_local_world_size(),
            "attempts_here": list(_ATTEMPTS_HERE)}


def environment(config: dict[str, Any]) -> dict[str, Any]:
    """What a worker actor sees of its environment: the env_vars of its Ray runtime
    environment, and the variables Cairn and ``worker_env`` set."""
    import ray

    runtime_env = ray.get_runtime_context().runtime_env
    return {
        "runtime_env_vars": dict(runtime_env.get("env_vars") or {}),
        "environ": {name: os.environ.get(name) for name in config["names"]},
        "pythonpath_set": bool(os.environ.get("PYTHONPATH")),
    }


def standby(config: dict[str, Any]) -> dict[str, Any]:
    """Rank 1 exits after its first report in attempt 0; each attempt's ranks say whether
    their process had ``standby_marker`` imported before the train function ran (only a
    warm standby spare preloads it, from ``CAIRN_PRELOAD``) and their pid."""
    import sys

    preloaded = "standby_marker" in sys.modules
    context = cairn.get_context()
    rank, attempt = context.get_world_rank(), context.get_attempt()
    cairn.report({"rank": rank, "attempt": attempt})
    if attempt == 0 and rank == 1:
        os._exit(1)
    return {"attempt": attempt, "preloaded": preloaded, "pid": os.getpid()}
