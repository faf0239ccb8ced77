"""FailureConfig(warm_standby=True): the local backend keeps a spare process per rank,
started during the attempt, and hands the next attempt to them (real workers, real
crashes); spares never outlive the run."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Callable

import fault_workloads
import pytest
from invariants import resumed_steps, run_dir

import cairn
from cairn import ScalingConfig, Trainer


def _worker_children() -> list[int]:
    """Worker processes (running or spare) whose parent is this test process."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read()
        except OSError:
            continue
        if parent == os.getpid() and b"cairn._src.worker.main" in command:
            found.append(int(entry))
    return found


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
@pytest.mark.parametrize("fault", ["exit_after", "raise"])
def test_a_restart_runs_on_the_spares_and_resumes(
    run_config: Callable[..., cairn.RunConfig], scratch: str, fault: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = run_config(failure_config=cairn.FailureConfig(max_failures=2, warm_standby=True))
    job = {"steps": 4, "scratch": scratch, "run_dir": run_dir(config), "first_index": 1,
           "faults": {"0:1:2": fault}}
    with caplog.at_level(logging.INFO, logger="cairn"):
        result = Trainer(fault_workloads.resumable, train_loop_config=job,
                         scaling_config=ScalingConfig(num_workers=2), run_config=config).fit()
    assert result.error is None
    steps = resumed_steps(scratch)
    assert steps[(1, 0)] == steps[(1, 1)] >= 1  # both ranks resumed from one checkpoint
    assert "Handing attempt 1 to 2 warm standby workers" in caplog.text
    # The spares started for attempt 2 (never needed) are gone with the run.
    assert _worker_children() == []


def test_without_warm_standby_no_spare_is_started(
    run_config: Callable[..., cairn.RunConfig], scratch: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = run_config(failure_config=cairn.FailureConfig(max_failures=1))
    job = {"steps": 3, "scratch": scratch, "run_dir": run_dir(config), "first_index": 1,
           "faults": {"0:0:1": "exit_after"}}
    with caplog.at_level(logging.DEBUG, logger="cairn"):
        Trainer(fault_workloads.resumable, train_loop_config=job,
                scaling_config=ScalingConfig(num_workers=2), run_config=config).fit()
    assert "warm standby" not in caplog.text


def test_a_spare_whose_driver_is_gone_exits_at_once() -> None:
    # A spare waits for its bootstrap on stdin; the driver's end (or kill -9) closes it.
    done = subprocess.run([sys.executable, "-m", "cairn._src.worker.main"],
                          input=b"", capture_output=True, timeout=120, check=False)
    assert (done.returncode, done.stderr) == (0, b"")


def test_warm_standby_must_be_a_bool() -> None:
    with pytest.raises(cairn.ConfigError,
                       match=r"^FailureConfig\.warm_standby='yes' must be True or False\.$"):
        cairn.FailureConfig(warm_standby="yes")  # type: ignore[arg-type]
