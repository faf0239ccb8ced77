"""Train functions for the local tier tests (imported by name in the worker processes)."""

from __future__ import annotations

import glob
import json
import os
import random
import signal
import tempfile
from typing import Any

import cairn
from cairn._src.storage.location import resolve


def payload(step: int, rank: int) -> bytes:
    """The bytes rank ``rank`` checkpoints at ``step`` (64 KiB, the same on every call)."""
    return random.Random(step * 1000 + rank).randbytes(64 * 1024)


def _damage(path: str) -> None:
    """Overwrite a file with other bytes of the same size (its checksum no longer holds)."""
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.write(bytes(size))


def train(config: dict[str, Any]) -> None:
    """Report ``steps`` SYNC checkpoints (``step_<n>/rank<r>.bin``); on attempt 0, after
    the report of ``crash_step``, damage what ``damage`` names ("storage": the stored copy
    of rank 0's file; "tier": this node's tier copy; "none") and SIGKILL rank 0. Every
    restore writes ``restored_<attempt>_<rank>.json`` with the step and whether each file
    holds its payload."""
    context = cairn.get_context()
    rank, attempt = context.get_world_rank(), context.get_attempt()
    start = 1
    checkpoint = cairn.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as restored:
            with open(os.path.join(restored, "state.json"), encoding="utf-8") as f:
                step = json.load(f)["step"]
            intact = {}
            for other in range(context.get_world_size()):
                with open(os.path.join(restored, f"rank{other}.bin"), "rb") as f:
                    intact[other] = f.read() == payload(step, other)
        with open(os.path.join(config["scratch"], f"restored_{attempt}_{rank}.json"), "w",
                  encoding="utf-8") as f:
            json.dump({"step": step, "intact": intact}, f)
        start = step + 1
    for step in range(start, config["steps"] + 1):
        with tempfile.TemporaryDirectory() as local:
            with open(os.path.join(local, f"rank{rank}.bin"), "wb") as f:
                f.write(payload(step, rank))
            with open(os.path.join(local, "state.json"), "w", encoding="utf-8") as f:
                json.dump({"step": step}, f)
            cairn.report({"step": step}, checkpoint=cairn.Checkpoint.from_directory(local),
                         checkpoint_dir_name=f"step_{step}")
        if attempt == 0 and step == config.get("crash_step") and rank == 0:
            if config["damage"] == "storage":
                location = resolve(config["run_uri"]).join(f"step_{step}/rank0.bin")
                with location.filesystem.open_output_stream(location.path) as out:
                    out.write(bytes(len(payload(step, 0))))
            elif config["damage"] == "tier":
                (copy,) = glob.glob(os.path.join(config["tier_dir"], "*",
                                                 f"*-step_{step}", "rank0.bin"))
                _damage(copy)
            os.kill(os.getpid(), signal.SIGKILL)
