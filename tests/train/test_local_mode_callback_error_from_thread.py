"""A callback that raises while the train function waits in a SYNC checkpoint report fails
the run with ControllerError, and fit() returns: in local mode (ScalingConfig(num_workers=0))
with fit() on the main thread or on another one, and with a worker process.

The controller emits a commit to the callbacks before it tells the workers, so a hook that
raises there leaves the report's commit message unsent: the train function is still in its
SYNC report when the run ends. In local mode off the main thread, the controller's stop
reaches it as an asynchronous exception, which cannot interrupt that wait; the end of its
connection, which the controller closes as the run ends, does.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_local_mode_callbacks import fit_on_a_thread

import cairn
from cairn import Checkpoint, ControllerError, ScalingConfig, Trainer, UserCallback
from cairn._src.observe.callbacks import TrainRunContext

RunConfigFactory = Callable[..., cairn.RunConfig]


class RaisesOnCheckpoint(cairn.Callback):
    def on_checkpoint(self, dir_name: str, metrics: dict[str, Any]) -> None:
        raise KeyError("callback bug")


class RaisesAfterReport(UserCallback):
    def after_report(self, run_context: TrainRunContext, metrics: list[dict[str, Any]],
                     checkpoint: Checkpoint | None) -> None:
        raise KeyError("callback bug")


CALLBACKS: dict[str, Callable[[], object]] = {
    "on_checkpoint": RaisesOnCheckpoint, "after_report": RaisesAfterReport}


def save_twice(config: dict[str, Any]) -> None:
    """Two SYNC checkpoint reports; the first never commits (the callback fails the run).
    ``seen`` (local mode only: the driver's own list) records each report's start and
    return."""
    seen: list[str] = config.get("seen", [])
    for step in range(2):
        with tempfile.TemporaryDirectory() as directory:
            Path(directory, "step").write_text(str(step))
            seen.append(f"report {step}")
            cairn.report({"step": step}, checkpoint=Checkpoint.from_directory(directory),
                         checkpoint_upload_mode="SYNC")
            seen.append(f"returned {step}")


def fit_on_this_thread(trainer: Trainer) -> dict[str, Any]:
    try:
        return {"result": trainer.fit()}
    except BaseException as exc:  # checked by the caller
        return {"error": exc}


def check_callback_error(outcome: dict[str, Any]) -> None:
    error = outcome.get("error")
    assert isinstance(error, ControllerError), outcome
    assert "callback bug" in str(error)
    assert isinstance(error.controller_failure, KeyError)


@pytest.mark.parametrize("hook", sorted(CALLBACKS))
@pytest.mark.parametrize("on_main_thread", [False, True], ids=["other-thread", "main-thread"])
def test_local_mode_callback_error_in_a_sync_report_fails_the_run(
        run_config: RunConfigFactory, hook: str, on_main_thread: bool) -> None:
    assert (threading.current_thread() is threading.main_thread()) or not on_main_thread
    seen: list[str] = []
    trainer = Trainer(save_twice, train_loop_config={"seen": seen},
                      scaling_config=ScalingConfig(num_workers=0),
                      run_config=run_config(progress=0, callbacks=[CALLBACKS[hook]()]))
    outcome = (fit_on_this_thread if on_main_thread else fit_on_a_thread)(trainer)
    check_callback_error(outcome)
    # The train function was stopped in its first report, waiting for a commit message
    # that the callback's error kept from being sent.
    assert seen == ["report 0"]


@pytest.mark.parametrize("hook", sorted(CALLBACKS))
def test_worker_process_callback_error_in_a_sync_report_fails_the_run(
        run_config: RunConfigFactory, hook: str) -> None:
    trainer = Trainer(save_twice, scaling_config=ScalingConfig(num_workers=1),
                      run_config=run_config(progress=0, callbacks=[CALLBACKS[hook]()]))
    check_callback_error(fit_on_this_thread(trainer))
