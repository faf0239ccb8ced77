"""Local mode, ScalingConfig(num_workers=0): an attempt that the controller ended while its
train function was still finishing (an ASYNC upload in flight) does not keep the next
attempt from running."""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cairn
from cairn import Checkpoint, CheckpointUploadMode, FailureConfig, ScalingConfig, Trainer

RunConfigFactory = Callable[..., cairn.RunConfig]


def slow_upload(checkpoint: Checkpoint, dir_name: str) -> Checkpoint:
    """An upload still running when the controller ends the attempt."""
    time.sleep(2)
    return checkpoint


def test_a_restart_runs_while_the_failed_attempt_still_finishes_an_async_upload(
        run_config: RunConfigFactory) -> None:
    attempts: list[int] = []

    def train() -> str:
        attempt = cairn.get_context().get_attempt()
        attempts.append(attempt)
        if attempt == 0:
            with tempfile.TemporaryDirectory() as directory:
                Path(directory, "step").write_text("0")
                cairn.report({"step": 0}, checkpoint=Checkpoint.from_directory(directory),
                             checkpoint_upload_mode=CheckpointUploadMode.ASYNC,
                             checkpoint_upload_fn=slow_upload)
            raise ValueError("bad batch")
        cairn.report({"step": 1})
        return "second attempt"

    outcome: dict[str, Any] = {}

    def fit() -> None:
        try:
            outcome["result"] = Trainer(
                train, scaling_config=ScalingConfig(num_workers=0),
                run_config=run_config(failure_config=FailureConfig(max_failures=1))).fit()
        except BaseException as exc:  # reported by the assertions below
            outcome["error"] = exc

    thread = threading.Thread(target=fit, name="test-fit")
    thread.start()
    thread.join(120)  # a hang waits for the worker start timeout (300 s) per attempt
    assert not thread.is_alive(), "fit() hung: attempt 1 was never served"
    assert "error" not in outcome, outcome.get("error")
    assert attempts == [0, 1]
    assert outcome["result"].return_value == "second attempt"
