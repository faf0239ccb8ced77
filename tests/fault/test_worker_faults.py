"""Worker failures with real processes and real signals (contract items 8 and 10)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import fault_workloads
import pytest
from invariants import check_run, resumed_steps, run_dir

import cairn
from cairn import FailureConfig, ScalingConfig, Trainer, TrainingFailedError

RunConfigFactory = Callable[..., cairn.RunConfig]


def fit(run_config: RunConfigFactory, scratch: str, *, workers: int = 2,
        max_failures: int = 2, **job: Any) -> tuple[cairn.Result, str]:
    config = run_config(failure_config=FailureConfig(max_failures=max_failures))
    directory = run_dir(config)
    job = {"steps": 4, "scratch": scratch, "run_dir": directory, "first_index": 1, **job}
    Trainer(fault_workloads.resumable, train_loop_config=job,
            scaling_config=ScalingConfig(num_workers=workers), run_config=config).fit()
    return check_run(directory, scratch), directory


@pytest.mark.parametrize("fault", ["raise", "exit_after", "kill_after"])
def test_failed_worker_restarts_from_the_latest_checkpoint(
    fault: str, run_config: RunConfigFactory, scratch: str
) -> None:
    result, _ = fit(run_config, scratch, faults={"0:1:1": fault})
    resumed = resumed_steps(scratch)
    # "raise" fails before step 1's report: resume from step 0. The others fail right
    # after step 1's SYNC report returned: never behind it.
    assert resumed[(1, 0)] == resumed[(1, 1)] == (1 if fault == "raise" else 2)
    assert result.goodput.failures == 1 and result.goodput.attempts == 2
    assert result.metrics == {"step": 3, "loss": 0.25}


def test_kill9_during_sync_upload(run_config: RunConfigFactory, scratch: str) -> None:
    result, _ = fit(run_config, scratch, blob_mib=64, faults={"0:0:2": "kill_during_upload"})
    assert resumed_steps(scratch)[(1, 0)] == 2
    # Attempt 0 made reports 1-3 (3 never committed); attempt 1 numbers on from 4.
    assert result.checkpoint is not None and result.checkpoint.path.endswith("checkpoint_000005")


def test_kill9_during_async_upload(run_config: RunConfigFactory, scratch: str) -> None:
    result, _ = fit(run_config, scratch, blob_mib=64, mode="ASYNC",
                    faults={"0:1:2": "kill_during_upload"})
    assert resumed_steps(scratch)[(1, 1)] in (1, 2)
    assert result.goodput.failures == 1


def test_kill9_between_upload_and_commit(run_config: RunConfigFactory, scratch: str) -> None:
    # Rank 0 uploads step 2 and waits for the commit, which needs rank 1 (delayed); rank 0
    # is killed meanwhile. Its upload had finished: rank 1 gets the grace to reach that
    # report, which then commits, and the restart resumes from step 2 (not from step 1).
    result, _ = fit(run_config, scratch,
                    faults={"0:0:2": "kill_before_commit", "0:1:2": "delay=1.5"})
    assert resumed_steps(scratch)[(1, 0)] == 3
    assert result.goodput.failures == 1


def test_a_kill_is_reported_as_sigkill_from_another_process_or_the_oom_killer(
        run_config: RunConfigFactory, scratch: str) -> None:
    with pytest.raises(TrainingFailedError,
                       match=r"\[rank 1\] Worker rank 1 \(pid \d+\) was killed by SIGKILL, sent "
                             r"by another process or the kernel's OOM killer"):
        fit(run_config, scratch, max_failures=0, faults={"0:1:1": "kill_after"})


def test_budget_spent_fails_with_every_attempt_recorded(
    run_config: RunConfigFactory, scratch: str
) -> None:
    faults = {f"{a}:0:1": "raise" for a in range(3)}
    with pytest.raises(TrainingFailedError, match=r"RuntimeError: injected failure at step 1"):
        fit(run_config, scratch, max_failures=2, faults=faults)
    directory = os.path.join(os.path.dirname(scratch), "storage", "run")
    result = check_run(directory, scratch)
    assert (result.goodput.attempts, result.goodput.failures) == (3, 3)


def test_unlimited_failures(run_config: RunConfigFactory, scratch: str) -> None:
    faults = {f"{a}:1:{a}": "exit_after" for a in range(3)}
    result, _ = fit(run_config, scratch, max_failures=-1, faults=faults)
    assert result.goodput.failures == 3


def test_rank_skipping_a_checkpoint_report(run_config: RunConfigFactory) -> None:
    with pytest.raises(TrainingFailedError,
                       match=r"rank 1 finished after 0 reports without reaching checkpoint "
                             r"report 1"):
        Trainer(fault_workloads.diverging, train_loop_config={"how": "return"},
                scaling_config=ScalingConfig(num_workers=2),
                run_config=run_config(failure_config=FailureConfig(max_failures=3))).fit()


def test_collective_timeout_names_the_missing_ranks(run_config: RunConfigFactory) -> None:
    config = run_config(failure_config=FailureConfig(collective_timeout_s=1.0))
    with pytest.raises(TrainingFailedError,
                       match=r"rank 1 did not reach report 1 within 1s of ranks 0, 2"):
        Trainer(fault_workloads.diverging, train_loop_config={"how": "hang"},
                scaling_config=ScalingConfig(num_workers=3), run_config=config).fit()
