"""Training functions the live-view tests run in real worker processes."""

from __future__ import annotations

import json
import os
import tempfile
import time
from typing import Any

import cairn
from cairn import Checkpoint


def steps_with_checkpoints(config: dict[str, Any]) -> None:
    """Reports ``steps`` steps, each with a checkpoint from rank 0 (``state.json``) and a
    file per rank, and resumes from the latest one. With ``crash_marker``, rank 1 leaves
    with ``os._exit(1)`` after report ``crash_after`` the first time (the marker file tells
    later attempts it already did). ``validation``: ask for a validation of each one."""
    context = cairn.get_context()
    rank = context.get_world_rank()
    start = 0
    resumed = cairn.get_checkpoint()
    if resumed is not None:
        with resumed.as_directory() as d, open(os.path.join(d, "state.json")) as f:
            start = json.load(f)["step"] + 1
    for step in range(start, config["steps"]):
        time.sleep(config.get("sleep_s", 0.0))
        with tempfile.TemporaryDirectory() as d:
            if rank == 0:
                with open(os.path.join(d, "state.json"), "w") as f:
                    json.dump({"step": step}, f)
            with open(os.path.join(d, f"rank_{rank}.bin"), "wb") as f:
                f.write(b"x" * 4096)
            extra: dict[str, Any] = {"validation": True} if config.get("validation") else {}
            cairn.report({"step": step, "loss": 1.0 / (step + 1)},
                         checkpoint=Checkpoint.from_directory(d), **extra)
        marker = config.get("crash_marker")
        if marker and rank == 1 and step == config.get("crash_after") and not os.path.exists(
                marker):
            open(marker, "w").close()
            os._exit(1)
    print(f"rank {rank} says goodbye")


def validate(checkpoint: Checkpoint, **kwargs: Any) -> dict[str, Any]:
    return {"val_loss": 0.5}
