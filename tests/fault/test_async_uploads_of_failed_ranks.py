"""Every rank raises while ASYNC uploads of its last reports are still under way: the
failed ranks finish those uploads before their processes exit, so those checkpoints
commit and the next attempt resumes from the last of them (the attempt used to end at
once, with no rank left to wait for, and the restart went back two checkpoints). Real
worker processes; the store's writes of the checkpoints' 1 MiB blobs are slow.
"""

from __future__ import annotations

import json
import os

import fault_store
import fault_workloads
import pytest
from invariants import check_run, resumed_steps

import cairn
from cairn import FailureConfig, ScalingConfig, Trainer

STEPS = 5
FAILING_STEP = 3  # each rank reports steps 0-2 (reports 1-3) ASYNC, then raises


@pytest.fixture(autouse=True)
def _faultfs() -> None:
    fault_store.register()


@pytest.mark.parametrize("num_workers", [1, 2])
def test_every_rank_raises_with_async_uploads_in_flight(
        tmp_path: str, scratch: str, num_workers: int) -> None:
    root = os.path.join(str(tmp_path), "slow")
    # One second per blob: with two uploads in flight per worker (max_pending_uploads),
    # reports 2 and 3 are still uploading when the train functions raise.
    storage = fault_store.faultfs_uri(root, slow="blob_", slow_s=1.0)
    faults = {f"0:{rank}:{FAILING_STEP}": "raise" for rank in range(num_workers)}
    config = cairn.RunConfig(name="run", storage_path=storage,
                             failure_config=FailureConfig(max_failures=1))
    result = Trainer(fault_workloads.resumable,
                     train_loop_config={"steps": STEPS, "scratch": scratch, "mode": "ASYNC",
                                        "blob_mib": 1, "faults": faults, "first_index": 1},
                     scaling_config=ScalingConfig(num_workers=num_workers),
                     run_config=config).fit()
    assert result.error is None
    run_dir = os.path.join(root, "storage", "run")
    with open(os.path.join(run_dir, "cairn_run.json")) as f:
        committed = [c["dir_name"] for c in json.load(f)["checkpoints"]]
    # Reports 1-3 of the failed attempt, then reports 4 and 5 (steps 3 and 4) of the next.
    assert committed == [f"checkpoint_{index:06d}" for index in range(1, STEPS + 1)]
    resumed = resumed_steps(scratch)
    assert {rank: resumed[(1, rank)] for rank in range(num_workers)} == dict.fromkeys(
        range(num_workers), FAILING_STEP)
    check_run(run_dir, scratch)
