"""A store written from the guide alone (guide_only_store.py) works: conformance, and the
user's own checkpoints reported by reference survive a worker crash and a driver kill."""

from __future__ import annotations

import os
import signal
import urllib.parse
import uuid
from collections.abc import Callable
from pathlib import Path

import guide_only_store
import pytest
import xyz_workloads
from xyz_support import StorageConformance, finish, start_driver, wait_for
from xyz_workloads import read_note, store_uri

import cairn
from cairn import CheckpointConfig, FailureConfig, ScalingConfig, Trainer


class TestGuideOnlyStoreConformance(StorageConformance):
    @pytest.fixture
    def base_uri(self, tmp_path: Path) -> str:
        root = urllib.parse.quote(str(tmp_path / "flat"), safe="/")
        return f"flatdir://bucket/{uuid.uuid4().hex[:8]}?root={root}"


def _steps_in_store(root: str) -> list[str]:
    keys = [info.key for info in guide_only_store.flatdir_store(f"flatdir://x?root={root}")
            .list("ckpts/run/")]
    return sorted({key.split("/")[2] for key in keys})


@pytest.mark.parametrize(("how", "fault_step"), [
    ("exit_after_commit", 1),
    ("kill_during_write", 2),
])
def test_own_checkpoints_resume_after_a_worker_crash(
    run_config: Callable[..., cairn.RunConfig], scratch: str, tmp_path: Path,
    how: str, fault_step: int,
) -> None:
    root = str(tmp_path / "flat")
    job = {"store": "guide_only", "root": root, "prefix": "ckpts/run",
           "steps": 4, "scratch": scratch,
           "fault": {"rank": 1, "step": fault_step, "how": how}}
    result = Trainer(
        xyz_workloads.own_checkpoints, train_loop_config=job,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=run_config(failure_config=FailureConfig(max_failures=1),
                              checkpoint_config=CheckpointConfig(num_to_keep=1)),
    ).fit()
    for rank in (0, 1):
        assert read_note(scratch, f"resumed_1_{rank}") == {
            "start": 2, "uri": store_uri(job, "ckpts/run/step_0001")}
    assert result.checkpoint is not None
    assert result.checkpoint.uri == store_uri(job, "ckpts/run/step_0003")
    result.checkpoint.verify()
    assert _steps_in_store(root) == ["step_0000", "step_0001", "step_0002", "step_0003"]


def test_own_checkpoints_resume_after_the_driver_is_killed(tmp_path: Path, scratch: str) -> None:
    root = str(tmp_path / "flat")
    storage = str(tmp_path / "runs")
    args = ("--store", "guide_only", "--mode", "NO_UPLOAD", "--root", root)
    driver = start_driver(storage, scratch, *args)
    wait_for(lambda: os.path.exists(os.path.join(scratch, "committed_0_2")), driver)
    driver.send_signal(signal.SIGKILL)
    driver.wait()

    summary = finish(start_driver(storage, scratch, *args, "--step-s", "0"))
    assert summary["registered_in_code"] == ["flatdir"]
    assert summary["attempts"] == 2
    assert summary["checkpoint"] == store_uri({"store": "guide_only", "root": root},
                                              "ckpts/run/step_0007")
    start = read_note(scratch, "resumed_1_0")["start"]
    assert start >= 3
    assert read_note(scratch, "resumed_1_0")["uri"] == store_uri(
        {"store": "guide_only", "root": root}, f"ckpts/run/step_{start - 1:04d}")
