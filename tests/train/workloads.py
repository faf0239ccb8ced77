"""Training functions the trainer tests run in real worker processes."""

from __future__ import annotations

import json
import os
import tempfile
import time
from typing import Any

import cairn
from cairn import Checkpoint, CheckpointUploadMode


def write_checkpoint(directory: str, files: dict[str, bytes]) -> Checkpoint:
    for name, data in files.items():
        path = os.path.join(directory, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    return Checkpoint.from_directory(directory)


def counting(config: dict[str, Any]) -> str:
    """Reports ``steps`` metric-only reports; returns a value from rank 0."""
    context = cairn.get_context()
    for step in range(config["steps"]):
        cairn.report({"step": step, "rank": context.get_world_rank()})
    print(f"hello from rank {context.get_world_rank()}")
    return f"done by {context.get_world_rank()} of {context.get_world_size()}"


def checkpoint_every_step(config: dict[str, Any]) -> None:
    """Each rank writes its own file into every checkpoint; records get_checkpoint()."""
    context = cairn.get_context()
    rank = context.get_world_rank()
    mode = CheckpointUploadMode(config.get("mode", "SYNC"))
    start = 0
    resumed = cairn.get_checkpoint()
    if resumed is not None:
        with resumed.as_directory() as d, open(os.path.join(d, "rank_0.json")) as f:
            start = json.load(f)["step"] + 1
    handles = []
    for step in range(start, config["steps"]):
        with tempfile.TemporaryDirectory() as d:
            files = {f"rank_{rank}.json": json.dumps({"step": step, "rank": rank}).encode()}
            checkpoint = write_checkpoint(d, files)
            if mode is CheckpointUploadMode.ASYNC:
                # ASYNC takes ownership of a copy; the temp dir goes away at once.
                own = tempfile.mkdtemp()
                checkpoint = write_checkpoint(own, files)
            handle = cairn.report({"step": step, "score": config.get("scores", {}).get(
                str(step), step)}, checkpoint=checkpoint, checkpoint_upload_mode=mode)
            handles.append(handle)
        if mode is CheckpointUploadMode.SYNC:
            latest = cairn.get_checkpoint()
            assert latest is not None
            _record(config, rank, step, latest.path)
    for handle in handles:
        handle.wait()


def _record(config: dict[str, Any], rank: int, step: int, path: str) -> None:
    scratch = config.get("scratch")
    if scratch:
        with open(os.path.join(scratch, f"latest_{rank}_{step}"), "w") as f:
            f.write(path)


def bad_report(config: dict[str, Any]) -> None:
    """Calls report() with the bad input named by config['case']."""
    case = config["case"]
    rank = cairn.get_context().get_world_rank()
    d = tempfile.mkdtemp()
    checkpoint = write_checkpoint(d, {f"r{rank}.bin": b"x"})
    if case == "not_dict":
        cairn.report([("loss", 1.0)])  # type: ignore[arg-type]
    elif case == "non_string_key":
        cairn.report({1: 2.0})  # type: ignore[dict-item]
    elif case == "unserializable":
        cairn.report({"model": object()})
    elif case == "missing_path":
        cairn.report({"acc": 1.0}, checkpoint=Checkpoint.from_directory("/no/such/checkpoint"))
    elif case == "unsafe_dir_name":
        cairn.report({"acc": 1.0}, checkpoint=checkpoint, checkpoint_dir_name="../escape")
    elif case == "unknown_mode":
        cairn.report({"acc": 1.0}, checkpoint=checkpoint, checkpoint_upload_mode="fast")
    elif case == "missing_score":
        cairn.report({"loss": 1.0}, checkpoint=checkpoint)
    elif case == "reused_dir_name":
        cairn.report({"acc": 1.0}, checkpoint=checkpoint, checkpoint_dir_name="best")
        again = write_checkpoint(tempfile.mkdtemp(), {f"r{rank}.bin": b"y"})
        cairn.report({"acc": 1.0}, checkpoint=again, checkpoint_dir_name="best")
    elif case == "disagreeing_dir_names":
        cairn.report({"acc": 1.0}, checkpoint=checkpoint, checkpoint_dir_name=f"epoch_{rank}")
    elif case == "collision":
        shared = write_checkpoint(tempfile.mkdtemp(), {"model.pt": b"rank%d" % rank})
        cairn.report({"acc": 1.0}, checkpoint=shared)
    else:
        raise AssertionError(case)


def wait_for_file(path: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(path)
        time.sleep(0.01)


def metric_reports_do_not_wait(config: dict[str, Any]) -> None:
    """Rank 0 reports many times while rank 1 is parked until rank 0 is done."""
    rank = cairn.get_context().get_world_rank()
    signal = os.path.join(config["scratch"], "rank0_done")
    if rank == 0:
        for step in range(200):
            cairn.report({"step": step})
        open(signal, "w").close()
    else:
        wait_for_file(signal)
        for step in range(200):
            cairn.report({"step": step})
