"""FailureConfig(keep_survivors=True) on the plain Trainer, real processes: the survivor
keeps its process through the failures of the other rank (an exit, a raise, a kill during
an upload, with warm standby spares as replacements), and the chaos invariants hold."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

import fault_workloads
import pytest
from invariants import check_run, resumed_steps, run_dir

import cairn
from cairn import ScalingConfig, Trainer


def _pids(text: str, pattern: str) -> list[list[int]]:
    return [[int(p) for p in found.split(", ")] for found in re.findall(pattern, text)]


@pytest.mark.parametrize(("fault", "standby"), [("exit_after", True), ("raise", False),
                                                ("kill_during_upload", False)])
def test_the_survivor_keeps_its_process_and_nothing_committed_is_lost(
    run_config: Callable[..., cairn.RunConfig], scratch: str, fault: str, standby: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = run_config(failure_config=cairn.FailureConfig(
        max_failures=1, keep_survivors=True, warm_standby=standby))
    job = {"steps": 5, "scratch": scratch, "run_dir": run_dir(config), "first_index": 1,
           "faults": {"0:1:2": fault}}
    with caplog.at_level(logging.DEBUG, logger="cairn"):
        result = Trainer(fault_workloads.resumable, train_loop_config=job,
                         scaling_config=ScalingConfig(num_workers=2), run_config=config).fit()
    assert result.error is None
    check_run(run_dir(config), scratch)
    steps = resumed_steps(scratch)
    assert steps[(1, 0)] == steps[(1, 1)] >= 1  # both ranks resumed from one checkpoint
    started = _pids(caplog.text, r"Started 2 local workers \(pids ([\d, ]+)\)")
    replaced = _pids(caplog.text, r"Replaced local workers of ranks \[1\] \(pids ([\d, ]+)\)")
    kept = _pids(caplog.text, r"; kept pids ([\d, ]+)")
    assert len(started) == 1 and kept == [[started[0][0]]]  # rank 0's process ran both
    if standby:
        spares = _pids(caplog.text, r"Started 2 warm standby workers \(pids ([\d, ]+)\)")
        assert replaced[0][0] == spares[0][1]  # rank 1's spare took its place


def test_a_survivor_that_does_not_stop_in_time_is_killed_with_the_group(
    run_config: Callable[..., cairn.RunConfig], scratch: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Rank 0 sleeps through its step (no report, no collective) longer than the bound.
    config = run_config(failure_config=cairn.FailureConfig(
        max_failures=1, keep_survivors=True, stop_timeout_s=1.0))
    job = {"steps": 4, "scratch": scratch, "run_dir": run_dir(config), "first_index": 1,
           "faults": {"0:1:1": "exit_after", "0:0:2": "delay=60"}}
    with caplog.at_level(logging.INFO, logger="cairn"):
        result = Trainer(fault_workloads.resumable, train_loop_config=job,
                         scaling_config=ScalingConfig(num_workers=2), run_config=config).fit()
    assert result.error is None
    check_run(run_dir(config), scratch)
    assert "restarting the whole group: a kept rank did not stop" in caplog.text
    assert len(_pids(caplog.text, r"Started 2 local workers \(pids ([\d, ]+)\)")) == 2


def test_what_a_stopped_attempt_made_is_collected_before_the_next(
    run_config: Callable[..., cairn.RunConfig],
) -> None:
    # The imports are frozen out of collections in a rank that may be kept; the attempt's
    # own objects are not: a reference cycle the stopped train function left is gone by
    # the time the kept process runs the next attempt.
    config = run_config(failure_config=cairn.FailureConfig(max_failures=1,
                                                           keep_survivors=True))
    result = Trainer(fault_workloads.leaves_cyclic_garbage,
                     scaling_config=ScalingConfig(num_workers=2), run_config=config).fit()
    assert result.error is None
    # Rank 0's process ran both attempts; attempt 0's garbage did not outlive it.
    assert result.return_value == {"frozen": True, "attempts_here": [0, 1],
                                   "earlier_alive": []}


def test_a_kept_process_does_not_keep_the_sessions_of_its_earlier_attempts(
    run_config: Callable[..., cairn.RunConfig],
) -> None:
    # Each attempt's session (its setup message, the train function's bytes, the config,
    # the datasets) holds reference cycles: none may be among what is frozen out of
    # collections, or a kept process would keep one per restart.
    config = run_config(failure_config=cairn.FailureConfig(max_failures=1,
                                                           keep_survivors=True))
    result = Trainer(fault_workloads.outlives_its_session,
                     scaling_config=ScalingConfig(num_workers=2), run_config=config).fit()
    assert result.error is None
    # Rank 0's process ran both attempts; a full collection in attempt 1 freed attempt 0's.
    assert result.return_value == {"attempts_here": [0, 1], "earlier_alive": []}
