"""``fit()`` raises what Ray Train raises: a WorkerGroupError (a TrainingFailedError) with
``worker_failures = {rank: exception}``, from real failing workers."""

from __future__ import annotations

import pickle
from pathlib import Path

import api_workloads
import pytest

import cairn
from cairn import (
    RunConfig,
    ScalingConfig,
    Trainer,
    TrainingFailedError,
    WorkerGroupError,
    WorkerProcessError,
)


def _trainer(tmp_path: Path, **config: object) -> Trainer:
    return Trainer(api_workloads.fail_on_first_attempt,
                   train_loop_config={"always": True, **config},
                   scaling_config=ScalingConfig(num_workers=2),
                   run_config=RunConfig(name="run", storage_path=str(tmp_path)))


def test_except_worker_group_error_catches_a_failing_rank(tmp_path: Path) -> None:
    caught = None
    try:
        _trainer(tmp_path, rank=1).fit()
    except WorkerGroupError as error:  # written as for Ray Train
        caught = error
    assert caught is not None and isinstance(caught, TrainingFailedError)
    assert list(caught.worker_failures) == [1]
    failure = caught.worker_failures[1]
    assert type(failure) is ValueError and str(failure) == "rank 1 is broken"
    message = str(caught)
    assert message.startswith("Training failed due to worker errors:\n[rank 1] ValueError: "
                              "rank 1 is broken")
    assert message.count("rank 1 is broken") <= 2  # the headline and the traceback, once each
    assert f"stay at {tmp_path / 'run'}" in message
    again = pickle.loads(pickle.dumps(caught))
    assert type(again) is WorkerGroupError and str(again) == message
    assert type(again.worker_failures[1]) is ValueError
    # Result.from_path reads the failed run back with what its event log kept of the error.
    read_back = cairn.Result.from_path(tmp_path / "run").error
    assert isinstance(read_back, cairn.RunFailedError)
    assert isinstance(read_back, TrainingFailedError)
    # The user's own exception type and message, not the group error that wraps it.
    assert (read_back.error_type, read_back.rank, read_back.ranks) == ("ValueError", 1, (1,))
    assert str(read_back) == "ValueError in rank 1: rank 1 is broken"
    again = pickle.loads(pickle.dumps(read_back))
    assert (type(again), str(again), again.rank) == (cairn.RunFailedError, str(read_back), 1)


def test_custom_exceptions_come_back_as_their_class(tmp_path: Path) -> None:
    with pytest.raises(TrainingFailedError) as info:
        _trainer(tmp_path, rank=0, how="custom").fit()
    assert isinstance(info.value, WorkerGroupError)
    failure = info.value.worker_failures[0]
    assert isinstance(failure, api_workloads.StepFailure)
    assert (failure.rank, failure.step) == (0, 0)


def test_a_rank_that_exits_gets_a_worker_process_error(tmp_path: Path) -> None:
    with pytest.raises(WorkerGroupError) as info:
        _trainer(tmp_path, rank=1, how="exit").fit()
    failure = info.value.worker_failures[1]
    assert isinstance(failure, WorkerProcessError) and isinstance(failure, RuntimeError)
    assert "Worker rank 1" in str(failure) and "3" in str(failure)
    assert 0 not in info.value.worker_failures
