"""The Ray-shaped errors pickle, keep their fields, and derive from the builtins Ray's do."""

from __future__ import annotations

import pickle

import pytest

import cairn
from cairn import (
    ControllerError,
    RunNotFoundError,
    TrainingFailedError,
    WorkerGroupError,
    WorkerProcessError,
)
from cairn._src.controller.failure_errors import worker_exceptions, worker_group_error
from cairn._src.controller.worker_failures import WorkerFailure
from cairn._src.errors import ResultLookupError
from cairn._src.observe.callbacks import call_hooks


def test_worker_group_error_round_trips() -> None:
    error = WorkerGroupError("[rank 0] ValueError: x", {0: ValueError("x")}, "/runs/r")
    assert str(error) == ("Training failed due to worker errors:\n[rank 0] ValueError: x\n"
                          "The run's committed checkpoints and metrics stay at /runs/r "
                          "(Result.from_path).")
    again = pickle.loads(pickle.dumps(error))
    assert str(again) == str(error) and again.run_path == "/runs/r"
    assert type(again.worker_failures[0]) is ValueError
    assert WorkerGroupError("boom").worker_failures == {}


@pytest.mark.parametrize("error", [RunNotFoundError("gone"), WorkerProcessError("killed"),
                                   ResultLookupError("none"), ControllerError(KeyError("k"))])
def test_errors_pickle(error: Exception) -> None:
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error) and str(again) == str(error)
    assert isinstance(again, cairn.CairnError)


def test_builtin_bases() -> None:
    assert issubclass(ResultLookupError, RuntimeError)
    assert issubclass(WorkerProcessError, RuntimeError)
    assert not issubclass(TrainingFailedError, WorkerGroupError)


def test_worker_exceptions_from_failures() -> None:
    failures = [
        WorkerFailure(rank=2, summary="Worker rank 2 (pid 9) was killed by signal 9",
                      traceback=""),
        WorkerFailure(rank=0, summary="KeyError: 'a'", traceback="Traceback ...\nKeyError: 'a'",
                      exception=pickle.dumps(KeyError("a"))),
        WorkerFailure(rank=0, summary="later", traceback=""),  # a rank's first failure counts
        WorkerFailure(rank=1, summary="Broken: ?", traceback="tb", exception=b"not a pickle"),
    ]
    found = worker_exceptions(failures)
    assert list(found) == [0, 1, 2]
    assert type(found[0]) is KeyError
    assert isinstance(found[1], WorkerProcessError) and str(found[1]) == "Broken: ?\ntb"
    assert str(found[2]) == "Worker rank 2 (pid 9) was killed by signal 9"
    error = worker_group_error(failures, "reason", None)
    assert error.worker_failures.keys() == found.keys() and "stay at" not in str(error)


def test_a_raising_hook_becomes_controller_error() -> None:
    class Bad(cairn.Callback):
        def on_run_end(self, result: cairn.Result) -> None:
            raise ZeroDivisionError("in the hook")

    seen: list[str] = []

    class Later(cairn.Callback):
        def on_run_end(self, result: cairn.Result) -> None:
            seen.append("called")

    with pytest.raises(ControllerError, match=r"controller error:\nin the hook") as info:
        call_hooks([Bad(), Later()], "on_run_end", None)
    assert isinstance(info.value.__cause__, ZeroDivisionError) and seen == []
    call_hooks([object()], "on_run_end", None)  # objects without the hook are skipped
