"""Local mode, ScalingConfig(num_workers=0): a run that fails for good raises its
WorkerGroupError from the exception the train function raised in the last attempt, the
object itself, kept in worker_failures[0] with the traceback that reaches the frame that
failed (for a printed traceback and a post-mortem debugger)."""

from __future__ import annotations

import json
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import pytest

import cairn
from cairn import FailureConfig, ScalingConfig, Trainer

RunConfigFactory = Callable[..., cairn.RunConfig]
LOCAL = ScalingConfig(num_workers=0)


class BatchError(Exception):
    pass


class LockedError(Exception):
    """An exception that cannot be pickled: it holds a lock."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


def load_batch(batch: int) -> None:
    raise BatchError(f"bad batch {batch}")


def frames_of(tb: TracebackType | None) -> list[str]:
    """The functions a post-mortem debugger walks through, outermost first."""
    names = []
    while tb is not None:
        names.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    return names


def failures_in_index(config: cairn.RunConfig) -> int:
    index = json.loads(Path(str(config.storage_path), "run", "cairn_run.json").read_text())
    return int(index["failures"])


def test_the_run_error_is_raised_from_the_train_functions_own_exception(
        run_config: RunConfigFactory) -> None:
    raised: list[BaseException] = []

    def train_step() -> None:
        cairn.report({"step": 0})
        try:
            load_batch(7)
        except BatchError as exc:
            raised.append(exc)
            raise

    config = run_config(failure_config=FailureConfig(max_failures=1))
    with pytest.raises(cairn.WorkerGroupError,
                       match=r"\[rank 0\] BatchError: bad batch 7") as info:
        Trainer(train_step, scaling_config=LOCAL, run_config=config).fit()
    error = info.value
    assert len(raised) == 2  # the first attempt failed too, and restarted
    own = error.worker_failures[0]
    # The last attempt's exception itself, not a copy, and fit() raised from it.
    assert own is raised[-1]
    assert error.__cause__ is own
    # Its traceback reaches the function's frame and the one that failed, with its locals.
    frames = frames_of(own.__traceback__)
    assert "train_step" in frames and frames[-1] == "load_batch"
    tb = own.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    assert tb is not None and tb.tb_frame.f_locals["batch"] == 7
    printed = "".join(traceback.format_exception(error))
    assert 'in load_batch\n    raise BatchError(f"bad batch {batch}")' in printed
    assert "The above exception was the direct cause of the following exception" in printed
    assert failures_in_index(config) == 2


def test_an_exception_that_cannot_be_pickled_is_kept_as_it_was_raised(
        run_config: RunConfigFactory) -> None:
    raised: list[BaseException] = []

    def train_step() -> None:
        error = LockedError("holds a lock")
        raised.append(error)
        raise error

    config = run_config()
    with pytest.raises(cairn.WorkerGroupError,
                       match=r"\[rank 0\] LockedError: holds a lock") as info:
        Trainer(train_step, scaling_config=LOCAL, run_config=config).fit()
    own = info.value.worker_failures[0]
    assert own is raised[0]
    assert info.value.__cause__ is own
    assert frames_of(own.__traceback__)[-1] == "train_step"
    assert failures_in_index(config) == 1
