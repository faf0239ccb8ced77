"""A rank that raises after an ASYNC report: its upload, already under way, still
completes, so the report every rank made commits and the next attempt resumes from it
(it used to be cut off by the failing process's exit, and the run went back one
checkpoint after the survivors waited out the grace). Real worker processes."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import cairn
from cairn import Checkpoint, CheckpointUploadMode, FailureConfig, ScalingConfig, Trainer


def _wait_for(path: str) -> None:
    deadline = time.monotonic() + 120
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(path)
        time.sleep(0.01)


def raise_after_an_async_report(config: dict[str, Any]) -> dict[str, Any] | None:
    context = cairn.get_context()
    rank = context.get_world_rank()
    checkpoint = cairn.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            return json.loads(Path(directory, "state.json").read_text())
    if context.get_attempt() > 0:
        return None  # resumed from nothing: the report was lost
    marker = os.path.join(config["scratch"], "raised")
    if rank == 0:
        directory = tempfile.mkdtemp(dir=config["scratch"])
        Path(directory, "state.json").write_text(json.dumps({"step": 1}))

        def upload(given: Checkpoint, _name: str) -> Checkpoint:
            _wait_for(marker)  # still uploading when the train function raises
            return given

        cairn.report({"step": 1}, checkpoint=Checkpoint.from_directory(directory),
                     checkpoint_upload_mode=CheckpointUploadMode.ASYNC,
                     checkpoint_upload_fn=upload)
        Path(marker).touch()
        raise RuntimeError("rank 0 fails after its ASYNC report")
    cairn.report({"step": 1})
    time.sleep(600)  # ended by the restart
    return None


def test_a_failing_ranks_async_upload_still_commits(
        tmp_path: Path, run_config: Any, scratch: str) -> None:
    result = Trainer(raise_after_an_async_report, train_loop_config={"scratch": scratch},
                     scaling_config=ScalingConfig(num_workers=2),
                     run_config=run_config(failure_config=FailureConfig(max_failures=1))).fit()
    assert result.error is None
    assert result.return_value == {"step": 1}
