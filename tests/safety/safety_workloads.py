"""Training functions for the storage-safety tests (run in real worker processes)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any

import cairn
from cairn import Checkpoint, CheckpointUploadMode


def _write(directory: str, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        path = os.path.join(directory, *name.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)


def steps_with_checkpoints(config: dict[str, Any]) -> None:
    """Rank 0 checkpoints every step (SYNC); records which checkpoint it resumed from.

    ``files`` (name -> text, ``{step}`` filled in) are the checkpoint's files; with
    ``check_restore``, a resumed checkpoint is also restored with to_directory().
    """
    rank = cairn.get_context().get_world_rank()
    start = 0
    resumed = cairn.get_checkpoint()
    if resumed is not None:
        with resumed.as_directory() as directory, open(os.path.join(directory, "state")) as f:
            start = json.load(f)["step"] + 1
        if config.get("check_restore"):
            resumed.to_directory(tempfile.mkdtemp())
    if rank == 0:
        with open(os.path.join(config["scratch"], "resumed_at"), "a") as f:
            f.write(f"{start}\n")
    extra: dict[str, str] = config.get("files", {})
    for step in range(start, config["steps"]):
        checkpoint = None
        directory = tempfile.mkdtemp()
        if rank == 0:
            files = {"state": json.dumps({"step": step}).encode()}
            files.update({name: text.format(step=step).encode() for name, text in extra.items()})
            _write(directory, files)
            checkpoint = Checkpoint.from_directory(directory)
        cairn.report({"step": step}, checkpoint=checkpoint)


def report_reference(config: dict[str, Any]) -> None:
    """Rank 0 reports ``config['target']`` (already on disk) by reference, once."""
    checkpoint = Checkpoint(config["target"]) if cairn.get_context().get_world_rank() == 0 else None
    cairn.report({"step": 0}, checkpoint=checkpoint,
                 checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD)


def report_references(config: dict[str, Any]) -> None:
    """Rank 0 writes ``config['refs']``/ref<i> and reports each by reference, ``steps``
    times."""
    for step in range(config["steps"]):
        checkpoint = None
        if cairn.get_context().get_world_rank() == 0:
            target = os.path.join(config["refs"], f"ref{step}")
            _write(target, {"w.bin": b"weights %d" % step})
            checkpoint = Checkpoint(target)
        cairn.report({"step": step}, checkpoint=checkpoint,
                     checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD)


def upload_into_the_named_directory(config: dict[str, Any]) -> None:
    """Rank 0 checkpoints every step with a checkpoint_upload_fn that writes into a
    directory inside the one Cairn named for the checkpoint,
    build_checkpoint_path_from_name(name) + "/dcp", and returns that directory."""
    storage = cairn.get_context().get_storage()

    def upload(checkpoint: Checkpoint, dir_name: str) -> Checkpoint:
        target = os.path.join(storage.build_checkpoint_path_from_name(dir_name), "dcp")
        shutil.copytree(checkpoint.path, target)
        return Checkpoint(target)

    for step in range(config["steps"]):
        checkpoint = None
        if cairn.get_context().get_world_rank() == 0:
            directory = tempfile.mkdtemp()
            _write(directory, {"state": json.dumps({"step": step}).encode()})
            checkpoint = Checkpoint.from_directory(directory)
        cairn.report({"step": step}, checkpoint=checkpoint, checkpoint_upload_fn=upload)


def report_with(config: dict[str, Any]) -> None:
    """One report: metrics nested ``depth`` deep, or a checkpoint named ``dir_name``."""
    metrics: dict[str, Any] = {"step": 0}
    inner = metrics
    for _ in range(config.get("depth", 0)):
        inner["nested"] = {}
        inner = inner["nested"]
    checkpoint = None
    if "dir_name" in config:
        directory = tempfile.mkdtemp()
        _write(directory, {"state": b"{}"})
        checkpoint = Checkpoint.from_directory(directory)
    with open(os.path.join(config["scratch"], f"attempt_{cairn.get_context().get_attempt()}"),
              "w"):
        pass
    cairn.report(metrics, checkpoint=checkpoint,
                 checkpoint_dir_name=config.get("dir_name"))
