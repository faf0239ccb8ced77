"""Faults at awkward moments (issue 10, items 14, 16, 17): real workers, real local storage.

Faults are injected into the driver's own calls (a worker SIGKILLed right after it was
spawned, a store whose index write lands and then fails, deletions refused by the store);
the workers, the processes and the storage are real.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
from collections.abc import Callable
from typing import Any

import fault_store
import fault_workloads
import pytest
from invariants import check_run, resumed_steps, run_dir

import cairn
from cairn import FailureConfig, ScalingConfig, Trainer
from cairn._src.backends import local as local_backend
from cairn._src.checkpoint import manager as manager_module
from cairn._src.errors import StorageError
from cairn._src.storage.location import StorageLocation
from cairn._src.storage.retry import RetryPolicy

RunConfigFactory = Callable[..., cairn.RunConfig]
DEFAULT = RetryPolicy()


def trainer(config: cairn.RunConfig, scratch: str, steps: int) -> Trainer:
    directory = run_dir(config) if "://" not in str(config.storage_path) else ""
    return Trainer(
        fault_workloads.resumable,
        train_loop_config={"steps": steps, "scratch": scratch, "run_dir": directory,
                           "first_index": 1},
        scaling_config=ScalingConfig(num_workers=2), run_config=config)


def test_a_worker_killed_before_its_bootstrap_is_that_ranks_failure(
    run_config: RunConfigFactory, scratch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_popen = subprocess.Popen
    spawned: list[int] = []

    def popen(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        process: subprocess.Popen[bytes] = real_popen(*args, **kwargs)
        spawned.append(process.pid)
        if len(spawned) == 2:
            # Rank 1 of the first attempt dies before the driver writes its bootstrap.
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
        return process

    monkeypatch.setattr(local_backend.subprocess, "Popen", popen)
    config = run_config(failure_config=FailureConfig(max_failures=1))
    result = trainer(config, scratch, steps=3).fit()
    assert result.metrics == {"step": 2, "loss": 1.0 / 3}
    assert result.goodput.attempts == 2
    check_run(run_dir(config), scratch)


def test_a_commit_whose_index_write_landed_and_failed_is_resumed_from(
    run_config: RunConfigFactory, scratch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write = manager_module.write_index
    failed: list[int] = []

    def write_then_fail(location: StorageLocation, index: Any, retry: RetryPolicy,
                        **options: Any) -> None:
        real_write(location, index, retry, **options)
        if not failed and any(r.dir_name == "checkpoint_000002" for r in index.checkpoints):
            # The store wrote the index and the answer was lost.
            failed.append(1)
            raise StorageError("injected: the connection dropped after the write")

    monkeypatch.setattr(manager_module, "write_index", write_then_fail)
    config = run_config(failure_config=FailureConfig(max_failures=1))
    result = trainer(config, scratch, steps=4).fit()
    assert failed == [1]
    # The next attempt resumed from the checkpoint whose commit "failed": it is committed.
    assert resumed_steps(scratch)[(1, 0)] == 2
    assert result.metrics == {"step": 3, "loss": 0.25}
    checked = check_run(run_dir(config), scratch)
    names = [c.path.rsplit("/", 1)[-1] for c, _ in checked.best_checkpoints]
    assert "checkpoint_000002" in names


def refusing_deletions(monkeypatch: pytest.MonkeyPatch, times: int) -> list[str]:
    """Deletions of checkpoint directories fail ``times`` times (a storage error storm)."""
    real_delete = manager_module.delete_dir
    refused: list[str] = []

    def delete_dir(location: StorageLocation, retry: RetryPolicy = DEFAULT) -> None:
        if location.path.rsplit("/", 1)[-1].startswith("checkpoint_") and (
                times < 0 or len(refused) < times):
            refused.append(location.path.rsplit("/", 1)[-1])
            raise StorageError(f"injected: delete of {location.path} refused")
        real_delete(location, retry)

    monkeypatch.setattr(manager_module, "delete_dir", delete_dir)
    return refused


def test_a_failed_cleanup_delete_is_retried_later_in_the_run(
    run_config: RunConfigFactory, scratch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    refused = refusing_deletions(monkeypatch, times=2)
    config = run_config(checkpoint_config=cairn.CheckpointConfig(num_to_keep=1))
    trainer(config, scratch, steps=4).fit()
    assert refused
    # No directory the run dropped is left behind, with or without its manifest.
    assert sorted(n for n in os.listdir(run_dir(config)) if n.startswith("checkpoint_")) == [
        "checkpoint_000004"]
    result = cairn.Result.from_path(run_dir(config))
    assert result.checkpoint is not None
    result.checkpoint.verify()


def test_a_storage_still_refusing_deletions_gives_one_warning(
    run_config: RunConfigFactory, scratch: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    refusing_deletions(monkeypatch, times=-1)
    config = run_config(checkpoint_config=cairn.CheckpointConfig(num_to_keep=1))
    with caplog.at_level(logging.WARNING):
        result = trainer(config, scratch, steps=3).fit()
    assert result.metrics == {"step": 2, "loss": 1.0 / 3}
    final = [r for r in caplog.records if "the storage still refuses" in r.getMessage()]
    assert len(final) == 1
    assert "checkpoint_000001, checkpoint_000002" in final[0].getMessage()


def test_a_start_during_a_storage_outage_says_the_run_is_intact(
    tmp_path: str, scratch: str
) -> None:
    fault_store.register()
    root = os.path.join(str(tmp_path), "faultfs")

    def config(**options: object) -> cairn.RunConfig:
        return cairn.RunConfig(
            name="run", storage_path=fault_store.faultfs_uri(root, **options),
            startup_retry=RetryPolicy(max_attempts=3, initial_backoff_s=0.0))

    directory = os.path.join(root, "storage", "run")
    trainer(config(), scratch, steps=2).fit()
    assert os.path.isdir(os.path.join(directory, "checkpoint_000002"))
    with pytest.raises(StorageError, match=r"The driver could not start the run at .*: .*"
                                           r"injected transient failure.* The run is intact .* "
                                           r"can be started again with the same RunConfig .*"
                                           r"RunConfig\(startup_retry=RetryPolicy\("):
        trainer(config(fail_ratio=1.0), scratch, steps=4).fit()
    again = trainer(config(), scratch, steps=4)
    result = again.fit()
    assert result.metrics == {"step": 3, "loss": 0.25}
    assert resumed_steps(scratch)[(1, 0)] == 2


def test_startup_retry_must_be_a_retry_policy() -> None:
    with pytest.raises(cairn.ConfigError, match=r"RunConfig.startup_retry=5 must be a "
                                                r"cairn.RetryPolicy or None"):
        cairn.RunConfig(startup_retry=5)  # type: ignore[arg-type]
