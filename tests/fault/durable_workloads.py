"""A train function that records every fsync of its worker and has the whole run killed
(kill -9: the driver, every worker) right after its checkpoints are committed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import time
from typing import Any

import torch

import cairn
from cairn.torch import report_snapshot


def record_fsyncs(log: str) -> None:
    """Make this process's ``os.fsync`` append ``[start_ns, end_ns, path]`` to ``log``
    (monotonic clock: comparable across the processes of one machine)."""
    original = os.fsync

    def recording(fd: Any) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        start = time.monotonic_ns()
        original(fd)
        with open(log, "a", encoding="utf-8") as out:
            out.write(json.dumps([start, time.monotonic_ns(), path]) + "\n")

    os.fsync = recording


def expected_bytes(rank: int) -> bytes:
    """What rank ``rank``'s uploaded file holds (1 MiB, the same in every run)."""
    return bytes((rank * 7 + i) % 251 for i in range(256)) * 4096


def expected_tensor(rank: int) -> torch.Tensor:
    return torch.arange(100_000, dtype=torch.float32) + rank


def commit_then_die(config: dict[str, Any]) -> None:
    scratch = config["scratch"]
    rank = cairn.get_context().get_world_rank()
    record_fsyncs(os.path.join(scratch, f"fsync_worker_{rank}.jsonl"))
    with open(os.path.join(scratch, f"pid_{rank}"), "w", encoding="ascii") as out:
        out.write(str(os.getpid()))
    directory = tempfile.mkdtemp()
    os.makedirs(os.path.join(directory, "nested", "deep"))
    with open(os.path.join(directory, "nested", "deep", f"rank_{rank}.bin"), "wb") as out:
        out.write(expected_bytes(rank))
    if rank == 0:
        with open(os.path.join(directory, "top.bin"), "wb") as out:
            out.write(b"top" * 1000)
    # SYNC: returns once committed; then an in-memory snapshot, serialized in place.
    cairn.report({"step": 1}, checkpoint=cairn.Checkpoint.from_directory(directory))
    report_snapshot({"step": 2}, {"w": expected_tensor(rank)}, per_rank=True).wait()
    # A checkpoint_upload_fn that writes into the run's own directory (Ray's pattern),
    # without an fsync of its own.
    if rank == 0:
        def upload(checkpoint: cairn.Checkpoint, dir_name: str) -> cairn.Checkpoint:
            destination = os.path.join(config["storage"], "run", dir_name)
            shutil.copytree(checkpoint.path, destination)
            return cairn.Checkpoint.from_directory(destination)

        written = tempfile.mkdtemp()
        os.makedirs(os.path.join(written, "by_fn"))
        with open(os.path.join(written, "by_fn", "fn.bin"), "wb") as out:
            out.write(expected_bytes(9))
        cairn.report({"step": 3}, checkpoint=cairn.Checkpoint.from_directory(written),
                     checkpoint_upload_fn=upload)
    else:
        cairn.report({"step": 3})
    if rank != 0:
        time.sleep(600)
    # Committed: now the whole run goes at once, as if the machine lost power (what was
    # not fsynced is only in the page cache, which the test then evicts).
    with open(os.path.join(scratch, "pid_1"), encoding="ascii") as f:
        other = int(f.read())
    for pid in (os.getppid(), other):
        os.kill(pid, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
