"""Training on the xyz store (examples/xyzstorage) with real worker processes.

The user's own async checkpoints reported by reference (NO_UPLOAD) resume after a worker
crash, and retention forgets them, or deletes them when asked. Cairn-managed SYNC and
ASYNC uploads into the store resume too.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import xyz_workloads
from xyz_workloads import read_note, store_uri

import cairn
from cairn import CheckpointConfig, FailureConfig, ScalingConfig, Trainer

xyzstorage = pytest.importorskip("xyzstorage", reason="pip install -e examples/xyzstorage")

RunConfigFactory = Callable[..., cairn.RunConfig]
SHARD_FILES = {"rank_0.bin", "rank_0.json", "rank_1.bin", "rank_1.json"}


def _job(tmp_path: Path, scratch: str, **extra: Any) -> dict[str, Any]:
    return {"store": "xyz", "db": str(tmp_path / "xyz.db"), "prefix": "ckpts/run",
            "steps": 4, "scratch": scratch, **extra}


def _steps_in_store(db: str, prefix: str) -> list[str]:
    """The checkpoint prefixes (``step_NNNN``) that hold objects under ``prefix``."""
    keys = [key for key, _ in xyzstorage.connect(db).scan(prefix + "/")]
    return sorted({key[len(prefix) + 1:].split("/")[0] for key in keys})


@pytest.mark.parametrize(("how", "fault_step", "last_committed"), [
    ("exit_after_commit", 1, 1),
    ("sigkill_after_commit", 1, 1),
    # Killed while its own writer thread is halfway through step 2: never reported.
    ("kill_during_write", 2, 1),
])
def test_own_checkpoints_resume_after_a_worker_crash(
    run_config: RunConfigFactory, scratch: str, tmp_path: Path,
    how: str, fault_step: int, last_committed: int,
) -> None:
    job = _job(tmp_path, scratch, fault={"rank": 1, "step": fault_step, "how": how})

    def uri(step: int) -> str:
        return store_uri(job, f"ckpts/run/step_{step:04d}")

    result = Trainer(
        xyz_workloads.own_checkpoints, train_loop_config=job,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=run_config(failure_config=FailureConfig(max_failures=1),
                              checkpoint_config=CheckpointConfig(num_to_keep=2)),
    ).fit()

    # Both ranks of the new attempt resumed from the last committed step, downloaded from
    # the store by its URI alone (the workload checks every restored byte).
    for rank in (0, 1):
        assert read_note(scratch, f"resumed_1_{rank}") == {
            "start": last_committed + 1, "uri": uri(last_committed)}
    assert result.goodput.failures == 1
    frame = result.metrics_dataframe
    assert list(frame[frame["attempt"] == 1]["step"]) == list(range(last_committed + 1, 4))

    assert result.checkpoint is not None and result.checkpoint.uri == uri(3)
    result.checkpoint.verify()
    manifest = result.checkpoint.get_manifest()
    assert manifest is not None and set(manifest.files) == SHARD_FILES
    assert manifest.target_uri == uri(3)
    assert result.checkpoint.get_metadata() == {"step": 3}
    # num_to_keep=2: the checkpoint the attempt resumed from was protected only until the
    # attempt committed a newer one.
    assert {c.uri for c, _ in result.best_checkpoints} == {uri(2), uri(3)}
    # Retention forgot the older references; the user's data stays in the store.
    assert _steps_in_store(job["db"], "ckpts/run") == [
        "step_0000", "step_0001", "step_0002", "step_0003"]


def test_own_checkpoints_are_deleted_by_retention_only_when_asked(
    run_config: RunConfigFactory, scratch: str, tmp_path: Path
) -> None:
    job = _job(tmp_path, scratch, steps=3)
    config = run_config(checkpoint_config=CheckpointConfig(
        num_to_keep=1, delete_unmanaged_checkpoints=True))
    result = Trainer(xyz_workloads.own_checkpoints, train_loop_config=job,
                     scaling_config=ScalingConfig(num_workers=2), run_config=config).fit()
    assert result.checkpoint is not None
    assert result.checkpoint.uri == store_uri(job, "ckpts/run/step_0002")
    assert _steps_in_store(job["db"], "ckpts/run") == ["step_0002"]
    result.checkpoint.verify()


@pytest.mark.parametrize("mode", ["SYNC", "ASYNC"])
def test_cairn_uploads_into_the_store_and_resumes_after_a_crash(
    scratch: str, tmp_path: Path, mode: str
) -> None:
    db = str(tmp_path / "xyz.db")
    storage = f"xyz://runs?db={urllib.parse.quote(db, safe='/')}"

    def checkpoint_uri(index: int) -> str:
        return f"xyz://runs/run/checkpoint_{index:06d}?db={db}"

    job = {"store": "xyz", "db": db, "mode": mode, "steps": 4, "scratch": scratch,
           "fault": {"rank": 1, "step": 1, "how": "exit_after_commit"}}
    result = Trainer(
        xyz_workloads.uploaded_checkpoints, train_loop_config=job,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=cairn.RunConfig(
            name="run", storage_path=storage,
            failure_config=FailureConfig(max_failures=1),
            checkpoint_config=CheckpointConfig(num_to_keep=2)),
    ).fit()

    for rank in (0, 1):
        assert read_note(scratch, f"resumed_1_{rank}") == {"start": 2, "uri": checkpoint_uri(2)}
    # Report numbers of the failed attempt's unfinished reports are not reused, so the
    # last checkpoint's number depends on how far rank 0 got before the crash.
    assert result.checkpoint is not None and result.checkpoint.uri is not None
    assert result.checkpoint.uri.startswith("xyz://runs/run/checkpoint_")
    last = result.checkpoint.get_manifest()
    assert last is not None and last.metrics["step"] == 3
    kept = {c.uri for c, _ in result.best_checkpoints}
    assert result.checkpoint.uri in kept and checkpoint_uri(1) not in kept
    for checkpoint, _ in result.best_checkpoints:
        checkpoint.verify()
        manifest = checkpoint.get_manifest()
        assert manifest is not None and set(manifest.files) == SHARD_FILES

    # The whole run lives in the store: index, metrics, events, and exactly the kept
    # checkpoints (retention deleted the others, nothing partial remains).
    keys = [key for key, _ in xyzstorage.connect(db).scan("runs/run/")]
    top = {key.split("/")[2] for key in keys}
    assert {"cairn_run.json", "metrics", "events"} <= top
    assert {name for name in top if name.startswith("checkpoint_")} == {
        str(uri).split("?")[0].rsplit("/", 1)[1] for uri in kept}
    assert "lease.json" not in top  # released when fit() returned
    # A new process needs nothing but the URI to open the run.
    again = cairn.Result.from_path(f"xyz://runs/run?db={db}")
    assert again.checkpoint == result.checkpoint
