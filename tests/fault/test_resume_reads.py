"""What the driver reads of the resume checkpoint (CheckpointConfig.verify_on_resume), from
real runs: nothing for a checkpoint it committed itself, sizes only for one an earlier
driver committed, every byte with verify_on_resume="full"."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import fault_workloads
import pytest
from invariants import resumed_steps, run_dir

import cairn
from cairn import ScalingConfig, Trainer
from cairn._src.checkpoint import manager as manager_module


@pytest.fixture
def driver_reads(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """The checkpoints the driver size-checked and fully verified, by name."""
    seen: dict[str, list[str]] = {"sizes": [], "full": []}

    def spy(kind: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(loc: Any, files: Any, **kwargs: Any) -> Any:
            seen[kind].append(loc.path.rstrip("/").rsplit("/", 1)[-1])
            return real(loc, files, **kwargs)
        return call

    monkeypatch.setattr(manager_module, "check_directory_sizes",
                        spy("sizes", manager_module.check_directory_sizes))
    monkeypatch.setattr(manager_module, "verify_committed",
                        spy("full", manager_module.verify_committed))
    return seen


def test_a_checkpoint_this_driver_committed_is_not_read_again_after_a_crash(
    run_config: Callable[..., cairn.RunConfig], scratch: str,
    driver_reads: dict[str, list[str]],
) -> None:
    config = run_config(failure_config=cairn.FailureConfig(max_failures=1))
    job = {"steps": 4, "scratch": scratch, "run_dir": run_dir(config), "first_index": 1,
           "faults": {"0:1:1": "exit_after"}}
    result = Trainer(fault_workloads.resumable, train_loop_config=job,
                     scaling_config=ScalingConfig(num_workers=2), run_config=config).fit()
    assert result.error is None
    steps = resumed_steps(scratch)
    assert steps[(1, 0)] == steps[(1, 1)] >= 1  # resumed from a committed checkpoint
    assert driver_reads == {"sizes": [], "full": []}
    assert result.checkpoint is not None
    latest = result.checkpoint.path.rstrip("/").rsplit("/", 1)[-1]
    # A new driver did not commit it: a listing of sizes, no data read.
    job.update(steps=5, faults={})
    Trainer(fault_workloads.resumable, train_loop_config=job,
            scaling_config=ScalingConfig(num_workers=2), run_config=config).fit()
    assert driver_reads == {"sizes": [latest], "full": []}


def test_full_verification_on_resume_reads_every_byte(
    run_config: Callable[..., cairn.RunConfig], scratch: str,
    driver_reads: dict[str, list[str]],
) -> None:
    config = run_config(checkpoint_config=cairn.CheckpointConfig(verify_on_resume="full"))
    job = {"steps": 2, "scratch": scratch, "run_dir": run_dir(config), "first_index": 1}
    Trainer(fault_workloads.resumable, train_loop_config=job,
            scaling_config=ScalingConfig(num_workers=2), run_config=config).fit()
    job["steps"] = 3
    Trainer(fault_workloads.resumable, train_loop_config=job,
            scaling_config=ScalingConfig(num_workers=2), run_config=config).fit()
    assert driver_reads == {"sizes": [], "full": ["checkpoint_000002"]}


def test_verify_on_resume_must_be_sizes_or_full() -> None:
    with pytest.raises(cairn.ConfigError, match=r"CheckpointConfig\.verify_on_resume='fast' "
                                                r"is not one of 'sizes' .*'full'"):
        cairn.CheckpointConfig(verify_on_resume="fast")  # type: ignore[arg-type]


def test_damage_elsewhere_is_not_blamed_on_the_resume_checkpoint_twice(
    run_config: Callable[..., cairn.RunConfig], scratch: str,
    driver_reads: dict[str, list[str]],
) -> None:
    """A rank failing on damage that is not the resume checkpoint's: the first time, the
    checkpoint is verified in full (uncounted); it verifies, so the second time counts."""
    config = run_config()
    Trainer(fault_workloads.damaged_elsewhere, train_loop_config={"scratch": scratch},
            scaling_config=ScalingConfig(num_workers=2), run_config=config).fit()
    with pytest.raises(cairn.WorkerGroupError, match="a dataset shard failed its checksum"):
        Trainer(fault_workloads.damaged_elsewhere, train_loop_config={"scratch": scratch},
                scaling_config=ScalingConfig(num_workers=2), run_config=config).fit()
    assert driver_reads == {"sizes": ["checkpoint_000001"], "full": ["checkpoint_000001"]}
    assert cairn.Result.from_path(run_dir(config)).checkpoint is not None  # it verified
    attempts = sorted(name for name in os.listdir(scratch)
                      if name.startswith("damaged_elsewhere_"))
    assert attempts == ["damaged_elsewhere_1", "damaged_elsewhere_2"]
