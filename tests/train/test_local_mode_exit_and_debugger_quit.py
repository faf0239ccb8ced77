"""Local mode, ScalingConfig(num_workers=0): sys.exit() in the train function and "q" at a
debugger's prompt end the run as Ctrl-C does (interrupted, no failure counted, no
restart), and fit() raises them as they were raised, as Ray Train's local mode does."""

from __future__ import annotations

import bdb
import io
import json
import pdb
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import cairn
from cairn import FailureConfig, RetryPolicy, ScalingConfig, Trainer
from cairn._src.run.events import read_events
from cairn._src.run.status import run_history
from cairn._src.storage.location import resolve

RunConfigFactory = Callable[..., cairn.RunConfig]
LOCAL = ScalingConfig(num_workers=0)


def ended_interrupted_without_a_failure(config: cairn.RunConfig, attempts: int) -> None:
    """The run's history says interrupted, with no failure, and its index counts none."""
    run = Path(str(config.storage_path), "run")
    history = run_history(read_events(resolve(str(run / "events")), RetryPolicy()))
    assert (history.status, history.attempts, history.failures) == (
        "interrupted", attempts, ())
    index = json.loads((run / "cairn_run.json").read_text())
    assert index["failures"] == 0


def exit_with_zero() -> None:
    sys.exit(0)


def exit_as_lightning_on_ctrl_c() -> None:
    # Lightning's trainer catches Ctrl-C, shuts down and calls sys.exit(1).
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt:
        sys.exit(1)


@pytest.mark.parametrize(("leave", "code"), [(exit_with_zero, 0),
                                             (exit_as_lightning_on_ctrl_c, 1)])
def test_sys_exit_in_the_train_function_ends_the_run_and_is_raised_by_fit(
        run_config: RunConfigFactory, leave: Callable[[], None], code: int) -> None:
    calls: list[int] = []

    def train() -> None:
        calls.append(1)
        cairn.report({"step": 0})
        leave()

    config = run_config(failure_config=FailureConfig(max_failures=2))
    with pytest.raises(SystemExit) as info:
        Trainer(train, scaling_config=LOCAL, run_config=config).fit()
    assert info.value.code == code
    assert calls == [1]
    ended_interrupted_without_a_failure(config, attempts=1)


def test_quitting_the_debugger_ends_the_run_without_spending_its_failure_budget(
        run_config: RunConfigFactory) -> None:
    calls: list[bool] = []
    prompt = io.StringIO()

    def train(config: dict[str, Any]) -> None:
        calls.append(config["debug"])
        if config["debug"]:
            # breakpoint(), answered with "q" at its prompt.
            pdb.Pdb(stdin=io.StringIO("q\n"), stdout=prompt).set_trace()
        cairn.report({"done": 1})

    config = run_config(failure_config=FailureConfig(max_failures=2))
    with pytest.raises(bdb.BdbQuit):
        Trainer(train, train_loop_config={"debug": True}, scaling_config=LOCAL,
                run_config=config).fit()
    assert "(Pdb)" in prompt.getvalue()
    assert calls == [True]
    ended_interrupted_without_a_failure(config, attempts=1)
    # The same run, debugged, runs again: it spent nothing of its budget.
    result = Trainer(train, train_loop_config={"debug": False}, scaling_config=LOCAL,
                     run_config=config).fit()
    assert result.metrics == {"done": 1}
    assert calls == [True, False]
    index = json.loads(Path(str(config.storage_path), "run", "cairn_run.json").read_text())
    assert (index["attempts"], index["failures"]) == (2, 0)
