"""Driver callbacks cannot change the run, nor hide its own failure, in real runs.

* Every hook gets its own deep copy of the metrics: a hook that changes them changes
  neither the run's checks and commits, its manifests, index and metrics history, nor
  ``Result.metrics``, nor what the next callback sees.
* A hook called for a failed attempt (``on_failure``, ``after_exception``) that raises
  fails the run with a ControllerError that chains the attempt's own failure, and the
  failure is logged before the hook runs.
* A raising ``on_run_end``: a failed run raises its own error; a finished run raises the
  callback's ControllerError and stays stored as finished.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import pytest
from workloads import run_dir

import cairn
from cairn import (
    Checkpoint,
    CheckpointConfig,
    ControllerError,
    FailureConfig,
    ScalingConfig,
    Trainer,
    UserCallback,
    WorkerGroupError,
)
from cairn._src.observe.callbacks import TrainRunContext
from cairn._src.run.layout import INDEX_NAME, MANIFEST_NAME, METRICS_DIR

RunConfigFactory = Callable[..., cairn.RunConfig]


def _epoch_reports(config: dict[str, Any]) -> None:
    """Three checkpoint reports whose score ``loss`` falls; ``fail_at``: the epoch after
    whose report the first attempt raises."""
    start = 0
    checkpoint = cairn.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d, open(os.path.join(d, "state.json")) as f:
            start = json.load(f)["epoch"] + 1
    for epoch in range(start, 3):
        directory = tempfile.mkdtemp()
        with open(os.path.join(directory, "state.json"), "w") as f:
            json.dump({"epoch": epoch}, f)
        cairn.report({"epoch": epoch, "loss": 10 - epoch, "nested": {"seen": [epoch]}},
                     checkpoint=Checkpoint.from_directory(directory))
        if epoch == config.get("fail_at") and cairn.get_context().get_attempt() == 0:
            raise ValueError(f"TRAINING BUG epoch {epoch}")


def _vandalize(metrics: dict[str, Any]) -> None:
    metrics.pop("loss", None)  # the checkpoint_score_attribute
    metrics["epoch"] = f"epoch {metrics['epoch']}"
    metrics["added_by_callback"] = True
    metrics["nested"]["seen"].append("callback")


class Vandal(cairn.Callback, UserCallback):
    """Changes every metrics dict it is given, in every hook that gets one."""

    def on_report(self, report_index: int, metrics: dict[str, Any]) -> None:
        _vandalize(metrics)

    def on_checkpoint(self, dir_name: str, metrics: dict[str, Any]) -> None:
        _vandalize(metrics)

    def after_report(self, run_context: TrainRunContext, metrics: list[dict[str, Any]],
                     checkpoint: Checkpoint | None) -> None:
        _vandalize(metrics[0])


class Witness(cairn.Callback, UserCallback):
    """Records what it is given, after the Vandal in the list."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def on_report(self, report_index: int, metrics: dict[str, Any]) -> None:
        self.seen.append(("on_report", metrics))

    def on_checkpoint(self, dir_name: str, metrics: dict[str, Any]) -> None:
        self.seen.append(("on_checkpoint", metrics))

    def after_report(self, run_context: TrainRunContext, metrics: list[dict[str, Any]],
                     checkpoint: Checkpoint | None) -> None:
        self.seen.append(("after_report", metrics[0]))


def _reported(epoch: int) -> dict[str, Any]:
    return {"epoch": epoch, "loss": 10 - epoch, "nested": {"seen": [epoch]}}


def test_a_hook_that_changes_its_metrics_changes_nothing_the_run_keeps(
    run_config: RunConfigFactory,
) -> None:
    witness = Witness()
    config = run_config(callbacks=[Vandal(), witness], checkpoint_config=CheckpointConfig(
        num_to_keep=1, checkpoint_score_attribute="loss", checkpoint_score_order="min"))
    result = Trainer(_epoch_reports, scaling_config=ScalingConfig(num_workers=1),
                     run_config=config).fit()
    # The score check and the commit used what the worker sent: every report committed.
    assert result.error is None
    assert result.metrics == _reported(2)
    assert [m for _, m in result.best_checkpoints] == [_reported(2)]
    run = run_dir(config)
    with open(os.path.join(run, "checkpoint_000003", MANIFEST_NAME)) as f:
        assert json.load(f)["metrics"] == _reported(2)
    with open(os.path.join(run, INDEX_NAME)) as f:
        assert [c["metrics"] for c in json.load(f)["checkpoints"]] == [_reported(2)]
    history = []
    for name in sorted(os.listdir(os.path.join(run, METRICS_DIR))):
        with open(os.path.join(run, METRICS_DIR, name)) as f:
            history += [json.loads(line)["metrics"] for line in f if line.strip()]
    assert history == [_reported(0), _reported(1), _reported(2)]
    assert cairn.Result.from_path(run).metrics == _reported(2)
    # Each callback has its own copy: the one after the Vandal sees what was reported.
    assert witness.seen == [(hook, _reported(epoch)) for epoch in range(3)
                            for hook in ("on_report", "on_checkpoint", "after_report")]


def _raising(hook: str) -> Any:
    def boom(*args: Any) -> None:
        raise RuntimeError(f"callback boom in {hook}")

    callback: Any = UserCallback() if hook.startswith("after_") else cairn.Callback()
    setattr(callback, hook, boom)
    return callback


@pytest.mark.parametrize("hook", ["on_failure", "after_exception"])
def test_a_failure_hook_that_raises_keeps_the_attempts_failure_in_sight(
    run_config: RunConfigFactory, caplog: pytest.LogCaptureFixture, hook: str,
) -> None:
    caplog.set_level(logging.WARNING, logger="cairn")
    trainer = Trainer(_epoch_reports, train_loop_config={"fail_at": 1},
                      scaling_config=ScalingConfig(num_workers=1),
                      run_config=run_config(callbacks=[_raising(hook)],
                                            failure_config=FailureConfig(max_failures=1)))
    with pytest.raises(ControllerError, match=f"callback boom in {hook}") as info:
        trainer.fit()
    # The callback's error, raised while the attempt's failure was handled: the
    # traceback shows the worker's error first.
    raised = info.value.controller_failure
    assert isinstance(raised, RuntimeError)
    failure = raised.__context__
    assert isinstance(failure, WorkerGroupError)
    assert str(failure.worker_failures[0]) == "TRAINING BUG epoch 1"
    if sys.version_info >= (3, 11):
        assert info.value.__notes__ == [
            "The callback was called for this failure of the attempt: [rank 0] ValueError: "
            "TRAINING BUG epoch 1"]
    # Logged before the hook ran, with the decision on it.
    messages = [r.getMessage() for r in caplog.records]
    failed = [i for i, m in enumerate(messages) if m.startswith(
        "Attempt 0 failed ([rank 0] ValueError: TRAINING BUG epoch 1); failure 1 of 1 "
        "allowed: RETRY")]
    raised_in = [i for i, m in enumerate(messages) if m.endswith(f"raised in {hook}")]
    assert failed and raised_in and failed[0] < raised_in[0], messages


def test_on_run_end_that_raises_after_a_failed_run_raises_the_runs_error(
    run_config: RunConfigFactory,
) -> None:
    trainer = Trainer(_epoch_reports, train_loop_config={"fail_at": 1},
                      scaling_config=ScalingConfig(num_workers=1),
                      run_config=run_config(callbacks=[_raising("on_run_end")],
                                            failure_config=FailureConfig(max_failures=0)))
    with pytest.raises(WorkerGroupError, match="TRAINING BUG epoch 1") as info:
        trainer.fit()
    assert str(info.value.worker_failures[0]) == "TRAINING BUG epoch 1"
    hook_error = info.value.__context__
    assert isinstance(hook_error, ControllerError)
    assert str(hook_error.controller_failure) == "callback boom in on_run_end"


def test_on_run_end_that_raises_after_a_finished_run_raises_and_the_run_stays_finished(
    run_config: RunConfigFactory, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="cairn")
    config = run_config(callbacks=[_raising("on_run_end")])
    trainer = Trainer(_epoch_reports, scaling_config=ScalingConfig(num_workers=1),
                      run_config=config)
    with pytest.raises(ControllerError, match="callback boom in on_run_end") as info:
        trainer.fit()
    finished = (f"Run 'run' finished and is stored as finished at {run_dir(config)} "
                "(Result.from_path reads it)")
    if sys.version_info >= (3, 11):
        assert info.value.__notes__ == [
            f"{finished}; the error is its on_run_end callback's."]
    assert any(r.getMessage().startswith(finished) for r in caplog.records)
    stored = cairn.Result.from_path(run_dir(config))
    assert stored.error is None and stored.metrics == _reported(2)
