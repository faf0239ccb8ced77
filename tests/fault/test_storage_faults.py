"""Storage faults: flaky operations, a full disk, upload failure policies (items 10-11)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import fault_store
import fault_workloads
import pytest
from invariants import check_run, resumed_steps

import cairn
import cairn.storage
from cairn import CheckpointConfig, FailureConfig, ScalingConfig, Trainer, TrainingFailedError


@pytest.fixture(autouse=True)
def _faultfs() -> None:
    fault_store.register()


def fit(storage: str, scratch: str, *, policy: str = "fail", max_failures: int = 0,
        num_to_keep: int | None = None, read_back: str | None = None,
        **job: object) -> cairn.Result:
    # Enough attempts that a fifth of failing operations (two per stat on this store) never
    # exhausts them by chance: 0.36 ** 14 is about 6e-7 per call.
    config = cairn.RunConfig(
        name="run", storage_path=storage,
        checkpoint_config=CheckpointConfig(upload_failure_policy=policy,  # type: ignore[arg-type]
                                           num_to_keep=num_to_keep),
        failure_config=FailureConfig(max_failures=max_failures),
        storage_retry=cairn.RetryPolicy(max_attempts=14, initial_backoff_s=0.001,
                                        max_backoff_s=0.01),
    )
    directory = cairn.storage.resolve(storage).join("run")
    Trainer(fault_workloads.resumable,
            train_loop_config={"steps": 4, "scratch": scratch, "run_dir": directory.path,
                               "first_index": 1, **job},
            scaling_config=ScalingConfig(num_workers=2), run_config=config).fit()
    # Read back through ``read_back`` when given: Result.from_path retries with the default
    # policy, which a fifth of failing operations can exhaust by chance.
    back = directory if read_back is None else cairn.storage.resolve(read_back).join("run")
    return cairn.Result.from_path(back.uri or back.path)


def test_flaky_storage_still_completes(tmp_path: str, scratch: str) -> None:
    # A fifth of every storage operation, in the driver and in the workers, fails with a
    # transient error; retries with backoff carry the run through.
    root = os.path.join(str(tmp_path), "flaky")
    uri = fault_store.faultfs_uri(root, fail_ratio=0.2, seed=7)
    result = fit(uri, scratch, mode="ASYNC", read_back=fault_store.faultfs_uri(root))
    assert result.metrics == {"step": 3, "loss": 0.25}
    assert result.checkpoint is not None
    result.checkpoint.verify()
    assert len(result.best_checkpoints) == 4


def test_upload_failure_fails_the_attempt_by_default(tmp_path: str, scratch: str) -> None:
    root = os.path.join(str(tmp_path), "full")
    uri = fault_store.faultfs_uri(root, enospc="checkpoint_000002/rank_1")
    with pytest.raises(TrainingFailedError,
                       match=r"\[rank 1\] StorageError: Could not upload .*rank_1.json.*"
                             r"No space left on device"):
        fit(uri, scratch)


def test_upload_failure_counts_against_the_budget(tmp_path: str, scratch: str) -> None:
    # The restart numbers its reports on (5, 6, ...), past the failing name: it completes.
    root = os.path.join(str(tmp_path), "full")
    uri = fault_store.faultfs_uri(root, enospc="checkpoint_000002/rank_1")
    result = fit(uri, scratch, max_failures=1)
    assert result.goodput.failures == 1
    assert resumed_steps(scratch)[(1, 0)] == 1


def test_upload_failure_skipped_with_a_warning(
    tmp_path: str, scratch: str, capfd: pytest.CaptureFixture[str]
) -> None:
    root = os.path.join(str(tmp_path), "full")
    uri = fault_store.faultfs_uri(root, enospc="checkpoint_000002/rank_1")
    result = fit(uri, scratch, policy="skip")
    assert "(rank 1) Skipping the checkpoint of report 2" in capfd.readouterr().out
    names = [c.path.rsplit("/", 1)[-1] for c, _ in result.best_checkpoints]
    assert sorted(names) == ["checkpoint_000001", "checkpoint_000003", "checkpoint_000004"]
    # Nothing of the skipped checkpoint is left (the store keeps empty folders: no objects).
    leftover = os.path.join(root, "storage", "run", "checkpoint_000002")
    assert [files for _, _, files in os.walk(leftover) if files] == []


@pytest.fixture
def small_tmpfs(tmp_path: str) -> Iterator[str]:
    mount = os.path.join(str(tmp_path), "tmpfs")
    os.makedirs(mount)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12m", "tmpfs", mount],
                          capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", mount], check=False)


def test_full_disk_skips_checkpoints_and_keeps_the_run_consistent(
    small_tmpfs: str, scratch: str
) -> None:
    # 2 ranks x 4 MiB per checkpoint on a 12 MiB disk: the first fits, the second does not.
    result = fit(small_tmpfs, scratch, policy="skip", num_to_keep=1, blob_mib=4)
    assert result.metrics == {"step": 3, "loss": 0.25}
    assert result.checkpoint is not None
    result.checkpoint.verify()
    check_run(os.path.join(small_tmpfs, "run"), scratch)


def test_full_disk_fails_the_run_with_a_clear_error(small_tmpfs: str, scratch: str) -> None:
    with pytest.raises(TrainingFailedError, match=r"No space left on device"):
        fit(small_tmpfs, scratch, blob_mib=4)
    result = check_run(os.path.join(small_tmpfs, "run"), scratch)
    assert result.checkpoint is not None and result.checkpoint.path.endswith("checkpoint_000001")


