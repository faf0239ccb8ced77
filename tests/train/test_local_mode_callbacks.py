"""Local mode, ScalingConfig(num_workers=0): callbacks and validation functions run on the
driver's threads, in the process that runs the train function, and the worker APIs refuse
them there as a driver process refuses them when the run has workers: a callback's
report() is not one of the run's reports, a collective in a callback fails at once instead
of waiting for the controller's own thread, and get_context() says where it was called. The
train function's own threads still reach the session, as in a worker process."""

from __future__ import annotations

import logging
import re
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import cairn
from cairn import Checkpoint, ControllerError, ReportedCheckpointStatus, ScalingConfig, Trainer
from cairn.collective import barrier

RunConfigFactory = Callable[..., cairn.RunConfig]
LOCAL = ScalingConfig(num_workers=0)
DRIVER = ("Callbacks and validation functions run on the driver, not in a worker, in local "
          "mode (ScalingConfig(num_workers=0)) too")


def save_step(step: int, **options: Any) -> None:
    """Report ``step`` with a checkpoint holding it."""
    with tempfile.TemporaryDirectory() as directory:
        Path(directory, "step").write_text(str(step))
        cairn.report({"step": step}, checkpoint=Checkpoint.from_directory(directory),
                     **options)


def fit_on_a_thread(trainer: Trainer) -> dict[str, Any]:
    """``trainer.fit()``'s result or error; a hang fails the test instead of blocking it (a
    daemon thread: a fit() that hangs does not keep pytest from exiting)."""
    outcome: dict[str, Any] = {}

    def fit() -> None:
        try:
            outcome["result"] = trainer.fit()
        except BaseException as exc:  # reported by the caller's assertions
            outcome["error"] = exc

    thread = threading.Thread(target=fit, name="test-fit", daemon=True)
    thread.start()
    thread.join(120)
    assert not thread.is_alive(), "fit() hung"
    return outcome


class CallsOnFirstReport(cairn.Callback):
    """Makes ``call`` in its first ``on_report``, then sets ``called``."""

    def __init__(self, call: Callable[[], object]) -> None:
        self.call: Callable[[], object] | None = call
        self.called = threading.Event()

    def on_report(self, report_index: int, metrics: dict[str, Any]) -> None:
        call, self.call = self.call, None  # once: a report it makes is not reported again
        if call is not None:
            try:
                call()
            finally:
                self.called.set()

    def train(self) -> None:
        """Reports, and reports again once the callback made its call: the session is the
        train function's all the while. Metrics only: it never waits for the controller
        that the callback's error ends."""
        cairn.report({"step": 0})
        self.called.wait(60)
        cairn.report({"step": 1})


CALLS: dict[str, Callable[[], object]] = {
    "report": lambda: cairn.report({"from_callback": 1}),
    "get_context": cairn.get_context,
    "collective.barrier": barrier,
}


@pytest.mark.parametrize("function", sorted(CALLS))
def test_a_worker_api_called_in_a_callback_fails_the_run_with_a_clear_error(
        function: str, run_config: RunConfigFactory) -> None:
    callback = CallsOnFirstReport(CALLS[function])
    config = run_config(callbacks=[callback])
    outcome = fit_on_a_thread(Trainer(callback.train, scaling_config=LOCAL, run_config=config))
    error = outcome.get("error")
    assert isinstance(error, ControllerError), outcome
    assert isinstance(error.controller_failure, cairn.ReportError)
    message = str(error.controller_failure)
    assert re.match(rf"cairn\.{re.escape(function)}\(\) was called outside a Cairn worker: on "
                    r"the driver's thread 'cairn-controller', which runs the callbacks of "
                    r"RunConfig\(callbacks=\.\.\.\)\. ", message), message
    assert DRIVER in message
    # What the callback called never reached the run: no report of its own in the history.
    run = Path(str(config.storage_path), "run")
    assert not [p for p in run.rglob("*") if p.is_file() and b"from_callback" in p.read_bytes()]


def reports_in_validation(checkpoint: Checkpoint) -> dict[str, Any]:
    cairn.report({"from_validation": 1})
    return {"validated": 1}


def test_report_in_a_validation_function_fails_that_validation_with_a_clear_error(
        run_config: RunConfigFactory, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="cairn")

    def train() -> list[tuple[str, dict[str, Any], ReportedCheckpointStatus]]:
        save_step(0, validation=True)
        save_step(1)
        return [(Path(r.checkpoint.path).name, r.metrics, r.status)
                for r in cairn.get_all_reported_checkpoints()]

    result = fit_on_a_thread(Trainer(
        train, scaling_config=LOCAL, run_config=run_config(),
        validation_config=cairn.ValidationConfig(reports_in_validation)))["result"]
    # The train function's reports are reports 1 and 2; the validation's added none.
    assert result.return_value == [
        ("checkpoint_000001", {"step": 0}, ReportedCheckpointStatus.VALIDATION_FAILED),
        ("checkpoint_000002", {"step": 1}, ReportedCheckpointStatus.COMMITTED),
    ]
    assert result.metrics == {"step": 1}
    messages = [r.getMessage() for r in caplog.records]
    assert any("OutsideWorkerError: cairn.report() was called outside a Cairn worker: on the "
               "driver's thread 'cairn-validate-checkpoint_000001', which runs a validation "
               "function" in m and DRIVER in m for m in messages), messages


def test_the_train_functions_own_threads_still_reach_the_session(
        run_config: RunConfigFactory) -> None:
    def train() -> list[int]:
        ranks: list[int] = []

        def side() -> None:
            ranks.append(cairn.get_context().get_world_rank())
            cairn.report({"from_thread": 1})

        thread = threading.Thread(target=side, name="user-thread")
        thread.start()
        thread.join()
        cairn.report({"step": 1})
        return ranks

    result = Trainer(train, scaling_config=LOCAL, run_config=run_config()).fit()
    assert result.return_value == [0]
    assert result.metrics == {"step": 1}
