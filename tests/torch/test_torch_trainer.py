"""TorchTrainer with real worker processes: the process group, restarts that never hang in
a collective, DDP and sharding, snapshots, and a bitwise-exact resume after a kill -9."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch_workloads

import cairn
from cairn import CheckpointConfig, FailureConfig, ScalingConfig
from cairn.torch import TorchConfig, TorchTrainer

RunConfigFactory = Callable[..., cairn.RunConfig]


def read_json(path: str | Path) -> Any:
    with open(path) as f:
        return json.load(f)


def test_a_rank_killed_inside_an_allreduce_restarts_the_group_on_a_new_port(
    run_config: RunConfigFactory, scratch: str
) -> None:
    # A collective timeout far longer than the test's: the restart must not wait for it.
    result = TorchTrainer(
        torch_workloads.allreduce_until_killed,
        train_loop_config={"scratch": scratch, "steps": 6, "kill_step": 3},
        torch_config=TorchConfig(timeout_s=3600),
        scaling_config=ScalingConfig(num_workers=2),
        run_config=run_config(failure_config=FailureConfig(max_failures=1)),
    ).fit()
    assert result.return_value == [float(3 + 2 * step) for step in range(6)]
    assert result.goodput.attempts == 2 and result.goodput.failures == 1
    ports = set()
    for attempt in (0, 1):
        for rank in (0, 1):
            env = read_json(os.path.join(scratch, f"env_{attempt}_{rank}.json"))
            assert env["MASTER_ADDR"] == "127.0.0.1"
            assert (env["RANK"], env["WORLD_SIZE"]) == (str(rank), "2")
            assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == (str(rank), "2")
            assert env["initialized"] and env["backend"] == "gloo"
            assert env["device"] == "cpu"
            ports.add((attempt, env["MASTER_PORT"]))
    assert len({port for _, port in ports}) == 2, f"one fresh port per attempt: {ports}"


def test_prepare_model_wraps_in_ddp_and_the_data_loader_shards_per_rank(
    run_config: RunConfigFactory, scratch: str
) -> None:
    TorchTrainer(
        torch_workloads.ddp_and_sharding,
        train_loop_config={"scratch": scratch},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=run_config(),
    ).fit()
    shards = [read_json(os.path.join(scratch, f"shard_{rank}.json")) for rank in (0, 1)]
    for shard in shards:
        assert shard["ddp"] and shard["same_weights"] and shard["batches"] == 2
        first, second = shard["epochs"]
        assert first != second and len(first) == len(second) == 8
    for epoch in (0, 1):
        ranks = [set(shard["epochs"][epoch]) for shard in shards]
        assert ranks[0].isdisjoint(ranks[1]) and ranks[0] | ranks[1] == set(range(16))


def test_report_snapshot_uploads_a_copy_taken_at_the_call(
    run_config: RunConfigFactory,
) -> None:
    result = TorchTrainer(
        torch_workloads.snapshot_forms,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=run_config(),
    ).fit()
    value = result.return_value
    assert [e.split("(")[0] for e in value["errors"]] == ["report_snapshot"] * 3
    assert "not neither" in value["errors"][0] and "not both" in value["errors"][1]
    assert "file_name='a/b.pt'" in value["errors"][2]
    files = value["files"]
    assert sorted(files) == ["rank_0/mine.pt", "rank_1/mine.pt", "state.pt"]
    assert torch.equal(files["state.pt"]["w"], torch.zeros(3, 2))  # copied before add_
    assert files["state.pt"]["step"] == 1
    assert torch.equal(files["rank_1/mine.pt"]["w"], torch.full((3, 2), 11.0))
    frame = result.metrics_dataframe
    assert list(frame["form"]) == [0, 1]
    # The copy is the train loop's checkpoint stall, in the goodput timeline.
    events = [json.loads(line) for path in sorted(Path(result.path, "events").glob("*.jsonl"))
              for line in path.read_text().splitlines() if line.strip()]
    copies = [e for e in events if e.get("type") == "blocked" and e["kind"] == "snapshot_copy"]
    assert sorted(e["rank"] for e in copies) == [0, 0, 1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_use_gpu_without_cuda_fails_at_once_without_spending_restarts(
    run_config: RunConfigFactory,
) -> None:
    config = run_config(failure_config=FailureConfig(max_failures=3))
    trainer = TorchTrainer(
        torch_workloads.ddp_and_sharding,
        scaling_config=ScalingConfig(num_workers=2, use_gpu=True),
        run_config=config,
    )
    with pytest.raises(cairn.TrainingFailedError, match=r"use_gpu=True\), but rank \d sees no"):
        trainer.fit()
    run = os.path.join(os.fspath(config.storage_path), str(config.name))
    assert cairn.Result.from_path(run).goodput.attempts == 1


EXACT = {"epochs": 3, "every": 5}


def test_resume_after_kill_9_is_bitwise_exact(
    run_config: RunConfigFactory, scratch: str, tmp_path: Path
) -> None:
    # Uninterrupted, with SYNC save_training_state checkpoints ...
    reference = TorchTrainer(
        torch_workloads.exact_resume,
        train_loop_config={**EXACT, "mode": "sync", "scratch": scratch},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=run_config(name="uninterrupted"),
    ).fit().return_value
    # ... and with ASYNC in-memory snapshots, rank 1 killed between two checkpoints.
    config = run_config(
        name="killed",
        failure_config=FailureConfig(max_failures=1),
        checkpoint_config=CheckpointConfig(num_to_keep=2),
    )
    killed = TorchTrainer(
        torch_workloads.exact_resume,
        train_loop_config={**EXACT, "mode": "snapshot", "scratch": scratch,
                           "crash_rank": 1, "crash_step": 13},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=config,
    ).fit()
    assert killed.goodput.failures == 1
    for rank in (0, 1):
        resumed = read_json(os.path.join(scratch, f"resumed_1_{rank}.json"))
        # 16 batches per epoch... 8 per rank: step 10 is epoch 1, batch 2.
        assert resumed == {"step": 10, "position": {"epoch": 1, "batch": 2}}
    final = killed.return_value
    assert final["step"] == reference["step"] == 24
    assert final["model"].keys() == reference["model"].keys()
    for name, tensor in reference["model"].items():
        assert torch.equal(final["model"][name], tensor), name
    for mine, theirs in zip(final["momentum"], reference["momentum"], strict=True):
        assert torch.equal(mine, theirs)
    assert torch.equal(final["next_draw"], reference["next_draw"])


def test_a_snapshot_written_straight_to_storage_creates_no_temporary_directory(
    run_config: RunConfigFactory, tmp_path: Path,
) -> None:
    result = TorchTrainer(
        torch_workloads.snapshot_with_no_temporary_directory,
        train_loop_config={"missing": str(tmp_path / "missing")},
        run_config=run_config(),
    ).fit()
    assert result.return_value is True
    assert not (tmp_path / "missing").exists()
