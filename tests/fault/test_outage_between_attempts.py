"""A storage outage between two attempts is a failure of the attempt, retried within
``max_failures``; it never ends ``fit()`` by itself or costs a committed checkpoint.

A rank fails after its checkpoint commits and starts an outage of the run index
(``fault_store``'s ``outage``): the driver's writes of the failure count and of the next
attempt's start then fail, after their retries.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import fault_store
import fault_workloads
import pytest

import cairn
from cairn import ControllerError, FailureConfig, ScalingConfig, Trainer
from cairn._src.run import layout

RETRIES = 3
MANIFEST = f"checkpoint_000001/{layout.MANIFEST_NAME}"


@pytest.fixture(autouse=True)
def _faultfs() -> None:
    fault_store.register()


def fit(root: str, scratch: str, outage: str, *, max_failures: int,
        faults: dict[str, str], permanent: bool = False,
        outage_key: str = "cairn_run.json") -> cairn.Result:
    uri = fault_store.faultfs_uri(root, outage=outage, outage_key=outage_key,
                                  outage_permanent=int(permanent))
    config = cairn.RunConfig(
        name="run", storage_path=uri,
        failure_config=FailureConfig(max_failures=max_failures),
        storage_retry=cairn.RetryPolicy(max_attempts=RETRIES, initial_backoff_s=0.001,
                                        max_backoff_s=0.01))
    return Trainer(fault_workloads.resumable,
                   train_loop_config={"steps": 3, "scratch": scratch, "run_dir": "",
                                      "first_index": 1, "faults": faults,
                                      "outage": outage},
                   scaling_config=ScalingConfig(num_workers=1), run_config=config).fit()


def read_index(root: str) -> dict[str, object]:
    with open(os.path.join(root, "storage", "run", "cairn_run.json")) as f:
        index: dict[str, object] = json.load(f)
    return index


def resumed_at(scratch: str, attempt: int) -> int:
    with open(os.path.join(scratch, f"resumed_{attempt}_0")) as f:
        step: int = json.load(f)
    return step


@pytest.mark.parametrize("failed_writes", [RETRIES, 2 * RETRIES])
def test_an_outage_as_an_attempt_fails_is_counted_and_the_run_resumes(
        tmp_path: Path, failed_writes: int) -> None:
    # RETRIES: the write of the failure count fails. 2 * RETRIES: so does the next
    # attempt's start, a second failure.
    root, scratch = str(tmp_path / "storage"), str(tmp_path / "scratch")
    os.makedirs(scratch)
    outage = str(tmp_path / "outage")
    failures = failed_writes // RETRIES
    result = fit(root, scratch, outage, max_failures=failures,
                 faults={"0:0:1": f"outage={failed_writes}"})
    assert result.error is None
    assert result.metrics["step"] == 2
    # The failed attempt's checkpoint (step 1) was resumed from: nothing committed is lost.
    attempts = sorted(int(n.split("_")[1]) for n in os.listdir(scratch)
                      if n.startswith("resumed_"))
    assert resumed_at(scratch, attempts[-1]) == 2
    index = read_index(root)
    assert index["failures"] == failures
    assert [r["dir_name"] for r in index["checkpoints"]] == [  # type: ignore[attr-defined]
        "checkpoint_000001", "checkpoint_000002", "checkpoint_000003"]


def test_an_outage_longer_than_the_failure_budget_fails_the_run_naming_storage(
        tmp_path: Path) -> None:
    root, scratch = str(tmp_path / "storage"), str(tmp_path / "scratch")
    os.makedirs(scratch)
    outage = str(tmp_path / "outage")
    with pytest.raises(ControllerError, match="injected outage") as raised:
        fit(root, scratch, outage, max_failures=1, faults={"0:0:1": "outage=1000"})
    assert isinstance(raised.value.controller_failure, OSError)
    # Storage back: the next fit() resumes from the checkpoint the failed attempt committed.
    os.remove(outage)
    result = fit(root, scratch, outage, max_failures=1, faults={})
    assert result.error is None and result.metrics["step"] == 2
    assert resumed_at(scratch, read_index(root)["attempts"] - 1) == 2  # type: ignore[operator]


def test_an_outage_while_a_new_driver_chooses_where_to_resume_is_a_failed_attempt(
        tmp_path: Path) -> None:
    root, scratch = str(tmp_path / "storage"), str(tmp_path / "scratch")
    os.makedirs(scratch)
    outage = str(tmp_path / "outage")
    with pytest.raises(cairn.TrainingFailedError):
        fit(root, scratch, outage, max_failures=0, faults={"0:0:1": "raise"})
    # The next driver reads the latest checkpoint's manifest before starting its workers:
    # the store fails every read of it, after its retries, once. With the first driver's
    # failure, two of two allowed.
    uri_outage = str(tmp_path / "manifest_outage")
    with open(uri_outage, "w") as f:
        f.write(str(RETRIES))
    result = fit(root, scratch, uri_outage, max_failures=2, faults={}, outage_key=MANIFEST)
    assert result.error is None and result.metrics["step"] == 2
    index = read_index(root)
    assert index["failures"] == 2
    # The manifest was read again at the next start; the checkpoint was resumed from.
    assert resumed_at(scratch, index["attempts"] - 1) == 1  # type: ignore[operator]


def test_an_error_no_retry_fixes_before_the_workers_start_fails_the_run_at_once(
        tmp_path: Path) -> None:
    # Permission denied on the run index: restarting would only meet it again, without
    # end under max_failures=-1.
    root, scratch = str(tmp_path / "storage"), str(tmp_path / "scratch")
    os.makedirs(scratch)
    outage = str(tmp_path / "outage")
    with pytest.raises(ControllerError, match="injected permanent error") as raised:
        fit(root, scratch, outage, max_failures=-1, faults={"0:0:1": "outage=1000"},
            permanent=True)
    assert isinstance(raised.value.controller_failure, OSError)
    attempts = [n for n in os.listdir(scratch) if n.startswith("resumed_")]
    assert attempts == ["resumed_0_0"]  # no worker started again
