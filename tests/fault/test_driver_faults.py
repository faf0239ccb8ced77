"""Driver failures: kill -9 of the driver, a rerun continues the run (contract item 9)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable

import fault_store
import fault_workloads
import pytest
from driver_process import finish, start_script, wait_for
from invariants import check_run, resumed_steps, run_dir

import cairn
from cairn import RunLeaseError, ScalingConfig, Trainer
from cairn._src.checkpoint.manifest import MANIFEST_NAME
from cairn._src.run.layout import LEASE_NAME

SCRIPT = os.path.join(os.path.dirname(__file__), "driver_script.py")


def start_driver(storage: str, scratch: str, *extra: str) -> subprocess.Popen[bytes]:
    return start_script(SCRIPT, storage, "run", scratch, *extra)


def test_driver_killed_mid_run_is_continued_by_a_rerun(tmp_path: str, scratch: str) -> None:
    storage = os.path.join(str(tmp_path), "storage")
    directory = os.path.join(storage, "run")
    driver = start_driver(storage, scratch)
    manifest = os.path.join(directory, "checkpoint_000003", MANIFEST_NAME)
    wait_for(lambda: os.path.exists(manifest), driver)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    # The dead driver's lease is still on storage; the rerun takes it over.
    assert os.path.exists(os.path.join(directory, LEASE_NAME))
    summary = finish(start_driver(storage, scratch))
    assert summary["metrics"] == {"step": 7, "loss": 0.125}
    result = check_run(directory, scratch)
    resumed = resumed_steps(scratch)
    assert resumed[(1, 0)] >= 3  # never behind checkpoint_000003, committed before the kill
    assert result.goodput.attempts == 2
    frame = result.metrics_dataframe
    first, second = frame[frame["attempt"] == 0], frame[frame["attempt"] == 1]
    # Numbering continued past every report of the dead driver.
    assert second["report_index"].min() > first["report_index"].max()


def test_driver_killed_between_manifest_and_index(tmp_path: str, scratch: str) -> None:
    # Every write of the run index sleeps 2 s: the driver dies after a checkpoint's
    # manifest is written and before the index names it. The rerun adopts it.
    root = os.path.join(str(tmp_path), "faultfs")
    storage = fault_store.faultfs_uri(root, slow="cairn_run.json", slow_s=2)
    directory = os.path.join(root, "storage", "run")
    driver = start_driver(storage, scratch, "--step-s", "0.5")
    manifest = os.path.join(directory, "checkpoint_000002", MANIFEST_NAME)
    wait_for(lambda: os.path.exists(manifest), driver)
    time.sleep(0.2)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    index = json.load(open(os.path.join(directory, "cairn_run.json")))
    assert "checkpoint_000002" not in [c["dir_name"] for c in index["checkpoints"]]
    # The rerun's store is the same directory without the slow index writes.
    finish(start_driver(fault_store.faultfs_uri(root), scratch, "--step-s", "0"))
    assert resumed_steps(scratch)[(1, 0)] >= 2


def test_second_live_driver_is_refused(tmp_path: str, scratch: str) -> None:
    storage = os.path.join(str(tmp_path), "storage")
    driver = start_driver(storage, scratch, "--steps", "30")
    wait_for(lambda: os.path.exists(os.path.join(storage, "run", "checkpoint_000001")), driver)
    try:
        with pytest.raises(RunLeaseError, match=r"is held by another live driver \(host .*, pid "
                                                rf"{driver.pid}\)"):
            Trainer(fault_workloads.resumable, train_loop_config={},
                    run_config=cairn.RunConfig(name="run", storage_path=storage)).fit()
    finally:
        driver.kill()
        driver.wait()
    # The refused driver changed nothing: the first driver's lease is intact.
    lease = json.load(open(os.path.join(storage, "run", LEASE_NAME)))
    assert lease["pid"] == driver.pid


@pytest.mark.parametrize("verify_on_resume", ["sizes", "full"])
def test_corrupt_latest_checkpoint_falls_back_to_the_previous(
    run_config: Callable[..., cairn.RunConfig], scratch: str, caplog: pytest.LogCaptureFixture,
    verify_on_resume: str,
) -> None:
    config = run_config(checkpoint_config=cairn.CheckpointConfig(
        verify_on_resume=verify_on_resume))  # type: ignore[arg-type]
    directory = run_dir(config)
    job = {"steps": 3, "scratch": scratch, "run_dir": directory, "first_index": 1}
    trainer = Trainer(fault_workloads.resumable, train_loop_config=job,
                      scaling_config=ScalingConfig(num_workers=2), run_config=config)
    trainer.fit()
    # One byte flipped, the size unchanged: only a checksum finds it.
    with open(os.path.join(directory, "checkpoint_000003", "rank_1.json"), "r+b") as f:
        f.write(b"X")
    job["steps"] = 5
    result = Trainer(fault_workloads.resumable, train_loop_config=job,
                     scaling_config=ScalingConfig(num_workers=2), run_config=config).fit()
    assert "Not resuming from checkpoint_000003 (report 3)" in caplog.text
    resumed = resumed_steps(scratch)
    if verify_on_resume == "full":
        # The driver read every byte before the workers started.
        assert resumed[(1, 0)] == resumed[(1, 1)] == 2  # from checkpoint_000002
    else:
        # The driver checked sizes only; the workers found the damage as they restored,
        # and the next attempt fell back on every rank, without counting a failure.
        assert "a rank found the checkpoint it resumed from, checkpoint_000003, damaged" in (
            caplog.text)
        assert (1, 0) not in resumed and (1, 1) not in resumed
        assert resumed[(2, 0)] == resumed[(2, 1)] == 2
    assert result.error is None
    index = json.load(open(os.path.join(directory, "cairn_run.json")))
    assert index["failures"] == 0
    assert "checkpoint_000003" not in {r["dir_name"] for r in index["checkpoints"]}


def test_missing_latest_checkpoint_falls_back(
    run_config: Callable[..., cairn.RunConfig], scratch: str
) -> None:
    config = run_config()
    directory = run_dir(config)
    job = {"steps": 3, "scratch": scratch, "run_dir": directory, "first_index": 1}
    Trainer(fault_workloads.resumable, train_loop_config=job, run_config=config).fit()
    os.remove(os.path.join(directory, "checkpoint_000003", "rank_0.json"))
    Trainer(fault_workloads.resumable, train_loop_config=job, run_config=config).fit()
    assert resumed_steps(scratch)[(1, 0)] == 2


def test_index_is_rebuilt_from_manifests(
    run_config: Callable[..., cairn.RunConfig], scratch: str
) -> None:
    config = run_config()
    directory = run_dir(config)
    job = {"steps": 3, "scratch": scratch, "run_dir": directory, "first_index": 1}
    Trainer(fault_workloads.resumable, train_loop_config=job, run_config=config).fit()
    with open(os.path.join(directory, "cairn_run.json"), "w") as f:
        f.write("{not json")
    job["steps"] = 4
    Trainer(fault_workloads.resumable, train_loop_config=job, run_config=config).fit()
    assert resumed_steps(scratch)[(1, 0)] == 3
    result = check_run(directory, scratch)
    assert len(result.best_checkpoints) == 4
