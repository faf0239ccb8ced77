"""A fit() that ends before its validations finished (the run failed) leaves them pending.

One warning names the checkpoints whose validation did not finish; no result is recorded
for them; the runner's thread ends once the validation function returns, instead of
waiting forever for a commit thread that has stopped; and the next fit() of the run
validates each of them once. A run that finishes waits for its validations (covered by
test_validation.py).
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from test_validation import events
from v2_workloads import wait_for_file

import cairn
from cairn import Checkpoint, FailureConfig, ScalingConfig, Trainer

RunConfigFactory = Callable[..., cairn.RunConfig]

# The validation runs in the test's process (the driver): the test holds it here.
GATE = threading.Event()
# The checkpoints the validation function was called with, in order.
VALIDATED: list[str] = []


@pytest.fixture(autouse=True)
def _fresh_gate() -> Iterator[None]:
    GATE.clear()
    VALIDATED.clear()
    yield
    GATE.set()


def held_validation(checkpoint: Checkpoint, *, started: str) -> dict[str, Any]:
    VALIDATED.append(os.path.basename(checkpoint.path))
    open(started, "w").close()
    GATE.wait(timeout=600)
    return {"val_score": 1.0}


def fail_while_validating(config: dict[str, Any]) -> None:
    """Report one checkpoint to validate, then fail once its validation has started. A
    resumed attempt (the next fit()) returns at once."""
    if cairn.get_checkpoint() is not None:
        return
    directory = tempfile.mkdtemp()
    with open(os.path.join(directory, "weights"), "w") as f:
        f.write("w")
    cairn.report({"step": 0}, checkpoint=Checkpoint.from_directory(directory),
                 validation=True)
    wait_for_file(config["started"])
    raise RuntimeError("the train function fails while its checkpoint is validated")


def _runner_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "cairn-validation"}


@pytest.mark.parametrize("num_workers", [1, 0])
def test_a_failed_run_names_the_unfinished_validation_and_the_next_fit_runs_it_once(
    run_config: RunConfigFactory, scratch: str, caplog: pytest.LogCaptureFixture,
    num_workers: int,
) -> None:
    caplog.set_level(logging.WARNING, logger="cairn")
    started = os.path.join(scratch, "started")
    config = run_config(failure_config=FailureConfig(max_failures=0))

    def trainer() -> Trainer:
        return Trainer(fail_while_validating, train_loop_config={"started": started},
                       scaling_config=ScalingConfig(num_workers=num_workers),
                       run_config=config,
                       validation_config=cairn.ValidationConfig(
                           held_validation,
                           cairn.ValidationTaskConfig(fn_kwargs={"started": started})))

    before = _runner_threads()
    with pytest.raises(cairn.TrainingFailedError):
        trainer().fit()
    warnings = [r.getMessage() for r in caplog.records
                if "fit() ended before these validations finished" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in caplog.records]
    assert "finished: checkpoint_000001." in warnings[0]
    assert "the next fit() of this run validates each of them once" in warnings[0]
    run = os.path.join(os.fspath(config.storage_path), "run")
    assert events(run, "validation_finished") == []

    # The validation function still runs; once it returns, the runner's thread ends
    # without applying its result (the commit thread has stopped).
    runners = _runner_threads() - before
    assert len(runners) == 1
    GATE.set()
    for thread in runners:
        thread.join(timeout=120)
    assert [t for t in runners if t.is_alive()] == []
    assert VALIDATED == ["checkpoint_000001"]
    assert events(run, "validation_finished") == []

    caplog.clear()
    result = trainer().fit()
    assert VALIDATED == ["checkpoint_000001", "checkpoint_000001"]
    assert [(e["dir_name"], e["status"]) for e in events(run, "validation_finished")] == [
        ("checkpoint_000001", "VALIDATED")]
    assert [m for _, m in result.best_checkpoints] == [{"step": 0, "val_score": 1.0}]
    assert not any("fit() ended before" in r.getMessage() for r in caplog.records)
