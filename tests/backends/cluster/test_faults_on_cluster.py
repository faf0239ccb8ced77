"""Worker and driver faults on a 3-node Ray cluster, with the local fault suite's
workloads and invariants: every fault restarts and resumes from the latest committed
checkpoint, never behind the last SYNC report that returned."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable
from typing import Any

import fault_workloads
import pytest
from driver_process import start_script, wait_for
from invariants import check_run, resumed_steps, run_dir

import cairn
from cairn import FailureConfig, ScalingConfig, Trainer
from cairn._src.checkpoint.manifest import MANIFEST_NAME
from cairn._src.run.layout import LEASE_NAME

from .conftest import TESTS, RayCluster

pytestmark = pytest.mark.slow

RunConfigFactory = Callable[..., cairn.RunConfig]
DRIVER = os.path.join(TESTS, "fault", "driver_script.py")


def fit(backend: str, run_config: RunConfigFactory, scratch: str, **job: Any) -> cairn.Result:
    config = run_config(failure_config=FailureConfig(max_failures=2))
    directory = run_dir(config)
    job = {"steps": 4, "scratch": scratch, "run_dir": directory, "first_index": 1, **job}
    Trainer(fault_workloads.resumable, train_loop_config=job,
            scaling_config=ScalingConfig(num_workers=3, backend=backend),
            run_config=config).fit()
    return check_run(directory, scratch)


@pytest.mark.parametrize("backend", ["local", "ray"])
@pytest.mark.parametrize("fault", ["raise", "exit_after", "kill_after"])
def test_failed_worker_restarts_from_the_latest_checkpoint(
    fault: str, backend: str, cluster: RayCluster, run_config: RunConfigFactory, scratch: str
) -> None:
    # Rank 1 fails at step 1: "raise" before step 1's report (resume from step 0), the
    # others (os._exit, SIGKILL) right after its SYNC report returned (never behind it).
    result = fit(backend, run_config, scratch, faults={"0:1:1": fault})
    resumed = resumed_steps(scratch)
    expected = 1 if fault == "raise" else 2
    assert [resumed[(1, rank)] for rank in range(3)] == [expected] * 3
    assert result.goodput.failures == 1 and result.goodput.attempts == 2
    assert result.metrics == {"step": 3, "loss": 0.25}


def test_ray_worker_failure_names_the_rank_and_how_it_ended(
    cluster: RayCluster, run_config: RunConfigFactory, scratch: str
) -> None:
    config = run_config(failure_config=FailureConfig(max_failures=0))
    job = {"steps": 4, "scratch": scratch, "run_dir": run_dir(config), "first_index": 1,
           "faults": {"0:2:1": "exit_after"}}
    with pytest.raises(cairn.WorkerGroupError,
                       match=r"\[rank 2\] Worker rank 2 \(pid \d+\) (died \(ActorDiedError: "
                             r"The actor is dead because its worker process has died\.\)|"
                             r"closed its connection to the controller)"):
        Trainer(fault_workloads.resumable, train_loop_config=job,
                scaling_config=ScalingConfig(num_workers=3, backend="ray"),
                run_config=config).fit()


def finish(process: subprocess.Popen[bytes]) -> dict[str, Any]:
    """The driver's JSON summary; Ray's own lines may come after it."""
    out, _ = process.communicate(timeout=300)
    text = out.decode(errors="replace")
    assert process.returncode == 0, text[-5000:]
    lines = [line for line in text.splitlines() if line.startswith('{"metrics"')]
    assert lines, text[-5000:]
    summary: dict[str, Any] = json.loads(lines[-1])
    return summary


def test_driver_killed_mid_run_is_continued_by_a_rerun(
    cluster: RayCluster, tmp_path: str, scratch: str
) -> None:
    storage = os.path.join(str(tmp_path), "storage")
    directory = os.path.join(storage, "run")
    args = (storage, "run", scratch, "--backend", "ray", "--workers", "3")
    driver = start_script(DRIVER, *args)
    manifest = os.path.join(directory, "checkpoint_000003", MANIFEST_NAME)
    wait_for(lambda: os.path.exists(manifest), driver, timeout=240)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    # The dead driver's lease is still on storage; the rerun, a new Ray job on the same
    # cluster, takes it over once Ray has released the dead job's workers.
    assert os.path.exists(os.path.join(directory, LEASE_NAME))
    summary = finish(start_script(DRIVER, *args))
    assert summary["metrics"] == {"step": 7, "loss": 0.125}
    result = check_run(directory, scratch)
    resumed = resumed_steps(scratch)
    # Never behind checkpoint_000003, committed before the kill; every rank agrees.
    assert resumed[(1, 0)] >= 3
    assert {resumed[(1, rank)] for rank in range(3)} == {resumed[(1, 0)]}
    assert result.goodput.attempts == 2
    frame = result.metrics_dataframe
    first, second = frame[frame["attempt"] == 0], frame[frame["attempt"] == 1]
    assert second["report_index"].min() > first["report_index"].max()
