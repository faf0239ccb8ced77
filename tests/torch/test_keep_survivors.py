"""FailureConfig(keep_survivors=True) with real processes, real kill -9 and gloo: the
survivors keep their processes (same pids), the failed rank is replaced, and the resumed
training is bit-exact against a run without failures."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import pytest
import survivor_workloads
import torch

import cairn
from cairn import CheckpointConfig, FailureConfig, ScalingConfig
from cairn.torch import TorchTrainer

JOB = {"epochs": 3, "every": 5}


def _read(scratch: str, name: str) -> Any:
    with open(os.path.join(scratch, name)) as f:
        return json.load(f)


def _fit(run_config: Any, scratch: str, name: str, faults: dict[str, Any], *,
         ballast_mib: int = 0, workers: int = 2, **failure: Any) -> cairn.Result:
    return TorchTrainer(
        survivor_workloads.train,
        train_loop_config={**JOB, "scratch": scratch, "faults": faults,
                           "ballast_mib": ballast_mib},
        scaling_config=ScalingConfig(num_workers=workers),
        run_config=run_config(name=name, failure_config=FailureConfig(**failure),
                              checkpoint_config=CheckpointConfig(num_to_keep=2)),
    ).fit()


def _assert_same_training(final: dict[str, Any], reference: dict[str, Any]) -> None:
    assert final["step"] == reference["step"]
    for name, tensor in reference["model"].items():
        assert torch.equal(final["model"][name], tensor), name
    assert torch.equal(final["next_draw"], reference["next_draw"])


@pytest.fixture
def reference(run_config: Any, tmp_path: Any) -> dict[str, Any]:
    scratch = tmp_path / "reference"
    scratch.mkdir()
    result = _fit(run_config, str(scratch), "reference", {})
    return result.return_value  # type: ignore[no-any-return]


@pytest.mark.parametrize("kind", ["kill", "raise"])
def test_the_survivor_keeps_its_process_and_resumes_bit_exact(
    run_config: Any, scratch: str, reference: dict[str, Any], kind: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="cairn"):
        result = _fit(run_config, scratch, "failed", {"0": {"rank": 1, "step": 13,
                                                             "kind": kind}},
                      max_failures=1, keep_survivors=True)
    assert result.error is None
    # Rank 0 (in the all_reduce when rank 1 died, or raised) ran attempt 1 in its process.
    assert _read(scratch, "pid_1_0.json") == _read(scratch, "pid_0_0.json")
    assert _read(scratch, "pid_1_1.json") != _read(scratch, "pid_0_1.json")
    assert _read(scratch, "resumed_1_0.json") == _read(scratch, "resumed_1_1.json") == 10
    assert "kept ranks [0], replacing [1]" in caplog.text
    _assert_same_training(result.return_value, reference)
    events = [json.loads(line) for line in _event_lines(result.path)]
    starts = [e for e in events if e["type"] == "attempt_start"]
    assert starts[-1]["kept"] == [0] and starts[-1]["replaced"] == [1]
    # The driver chose rank 0's memory copy for rank 0 and for its replacement peer.
    planned = {e["rank"]: e for e in events if e["type"] == "restore_planned"}
    assert planned[0]["kind"] == "memory" and planned[0]["index"] == 2, planned
    assert planned[1]["kind"] == "peer" and planned[1]["peer"] == 0, planned
    restored = {e["rank"]: e for e in events if e["type"] == "restored"}
    assert set(restored) == {0, 1}, events
    assert restored[0]["kind"].startswith("memory"), restored
    assert restored[1]["kind"].startswith("peer") and restored[1]["peer"] == 0, restored
    assert restored[0]["memory_bytes"] > 0 and restored[1]["peer_bytes"] > 0
    # The replacement fetched the peer's copy from its start, beside its train function.
    assert restored[1].get("prefetched") is True and "prefetched" not in restored[0]
    # Nothing from storage: the replaced rank's own small state (its RNGs) came from the
    # copy its predecessor sent the driver.
    assert restored[1]["kind"] == "peer+driver" and restored[1]["driver_bytes"] > 0
    assert "1 small files of its own from the driver" in planned[1]["reason"]
    assert restored[0]["bytes"] == restored[1]["bytes"] == 0, restored


def test_two_failures_in_a_row_keep_the_survivors_each_time(
    run_config: Any, scratch: str, reference: dict[str, Any],
) -> None:
    faults = {"0": {"rank": 1, "step": 13, "kind": "kill"},
              "1": {"rank": 0, "step": 22, "kind": "kill"}}
    result = _fit(run_config, scratch, "twice", faults, max_failures=2, keep_survivors=True)
    assert result.error is None
    assert _read(scratch, "pid_1_0.json") == _read(scratch, "pid_0_0.json")
    # Rank 1's replacement of attempt 1 survived rank 0's death in attempt 1.
    assert _read(scratch, "pid_2_1.json") == _read(scratch, "pid_1_1.json")
    assert _read(scratch, "pid_2_0.json") != _read(scratch, "pid_1_0.json")
    assert _read(scratch, "resumed_2_0.json") == 20
    _assert_same_training(result.return_value, reference)


def test_a_checkpoint_committed_while_the_survivor_stops_is_restored_from_its_memory(
    run_config: Any, scratch: str, reference: dict[str, Any],
) -> None:
    # Rank 1 dies right after its part of step 15's snapshot; rank 0 is still writing its
    # own (a large one), and is stopped: it names its copy of report 3 as pending, the
    # commit completes after that, and the next attempt resumes from report 3, from rank
    # 0's memory (which learns of the commit before it rejoins), not from storage.
    faults = {"0": {"rank": 1, "after_step": 15, "kind": "kill_after_snapshot"}}
    result = _fit(run_config, scratch, "in_flight", faults, ballast_mib=64, max_failures=1,
                  keep_survivors=True)
    assert result.error is None
    assert _read(scratch, "pid_1_0.json") == _read(scratch, "pid_0_0.json")
    assert _read(scratch, "resumed_1_0.json") == _read(scratch, "resumed_1_1.json") == 15
    [(_, planned, restored)] = _restores(result.path)
    assert planned[0]["kind"] == "memory" and planned[0]["index"] == 3, planned
    assert restored[0]["kind"] == "memory" and restored[1]["kind"] == "peer+driver", restored
    assert restored[0]["bytes"] == restored[1]["bytes"] == 0, restored
    _assert_same_training(result.return_value, reference)


def test_with_three_ranks_no_rank_reads_storage_after_one_crash(
    run_config: Any, scratch: str,
) -> None:
    # Rank 2's own small files (its RNG state) are held by nobody but the driver: a kept
    # rank restoring the whole checkpoint (rank 1's copy lacks rank 0's model file, so it
    # restores files) gets them from the driver too, not from storage.
    result = _fit(run_config, scratch, "three", {"0": {"rank": 2, "step": 13, "kind": "kill"}},
                  workers=3, max_failures=1, keep_survivors=True)
    assert result.error is None
    for rank in (0, 1):
        assert _read(scratch, f"pid_1_{rank}.json") == _read(scratch, f"pid_0_{rank}.json")
    [(_, planned, restored)] = _restores(result.path)
    assert [planned[r]["kind"] for r in range(3)] == ["memory", "memory", "peer"], planned
    assert all(restored[r]["bytes"] == 0 for r in range(3)), restored


def _restores(path: str) -> list[tuple[int, dict[int, Any], dict[int, Any]]]:
    """Per attempt after the first: (attempt, planned by rank, restored by rank)."""
    attempts: list[tuple[int, dict[int, Any], dict[int, Any]]] = []
    for event in map(json.loads, _event_lines(path)):
        if event["type"] == "attempt_start":
            attempts.append((event["attempt"], {}, {}))
        elif event["type"] == "restore_planned":
            attempts[-1][1][event["rank"]] = event
        elif event["type"] == "restored":
            attempts[-1][2][event["rank"]] = event
    return attempts[1:]


def test_a_corrupted_memory_copy_is_not_used_and_the_event_log_says_why(
    run_config: Any, scratch: str, reference: dict[str, Any],
) -> None:
    if not hasattr(os, "memfd_create"):
        pytest.skip("the peer's copy is not in shared memory here (memfd_create)")
    # Rank 0 changes its held copy; rank 1 is killed: neither may restore from that copy.
    faults = {"0": {"rank": 1, "step": 13, "kind": "kill", "corrupt": 0}}
    result = _fit(run_config, scratch, "corrupt", faults, max_failures=1,
                  keep_survivors=True)
    assert result.error is None
    assert _read(scratch, "pid_1_0.json") == _read(scratch, "pid_0_0.json")
    [(_, planned, restored)] = _restores(result.path)
    assert planned[0]["kind"] == "memory" and planned[1]["kind"] == "peer"
    # Files whose tensors changed come from storage, with the reason.
    assert "storage" in restored[0]["kind"], restored
    assert "this rank's memory copy of 'model.pt' does not match" in restored[0]["reason"]
    # Its own small state comes from the driver's copy, the peer's files that match
    # (its tensors unchanged) from the peer's shared memory.
    assert restored[1]["kind"] == "peer+driver+storage", restored
    assert ("peer rank 0's shared memory copy of 'model.pt' does not match the manifest's "
            "checksum") in restored[1]["reason"]
    assert "peer rank 0's copy of 'model.pt' does not match the manifest's checksum" in (
        restored[1]["reason"])
    assert restored[1].get("prefetched") is True, restored
    _assert_same_training(result.return_value, reference)


@pytest.mark.parametrize("route", ["shared memory", "file"])
def test_a_peer_killed_during_the_transfer(
    run_config: Any, scratch: str, reference: dict[str, Any], route: str,
) -> None:
    if route == "shared memory" and not hasattr(os, "memfd_create"):
        pytest.skip("no shared-memory snapshots here (memfd_create)")
    # Attempt 0: rank 1 is killed; attempt 1: rank 0 (the peer serving rank 1's restore)
    # is killed in the middle of the transfer, which rank 1 began at its start.
    faults = {"0": {"rank": 1, "step": 13, "kind": "kill"},
              "1": {"rank": 0, "kind": "kill_while_serving", "route": route}}
    result = _fit(run_config, scratch, "transfer", faults, ballast_mib=64, max_failures=2,
                  keep_survivors=True)
    assert result.error is None
    first, second = _restores(result.path)
    assert first[1][1]["kind"] == "peer", first
    assert first[2][1].get("prefetched") is True, first
    if route == "file":
        # Rank 1 got what the peer sent before it died, the rest from storage, and says
        # why.
        assert "storage" in first[2][1]["kind"], first
        assert "the transfer from peer rank 0 failed" in first[2][1]["reason"], first
    else:
        # The peer's memory outlives it while mapped: verified, it is used.
        assert first[2][1]["kind"] == "peer+driver", first
    # Attempt 2: nobody holds the checkpoint in memory (rank 1 never snapshotted): each
    # rank's own small files come from the driver, the rest from storage.
    assert {e["kind"] for e in second[1].values()} == {"driver"}, second
    assert {e["kind"] for e in second[2].values()} == {"driver+storage"}, second
    _assert_same_training(result.return_value, reference)


def test_without_keep_survivors_the_whole_group_restarts(
    run_config: Any, scratch: str,
) -> None:
    result = _fit(run_config, scratch, "whole", {"0": {"rank": 1, "step": 13, "kind": "kill"}},
                  max_failures=1)
    assert result.error is None
    assert _read(scratch, "pid_1_0.json") != _read(scratch, "pid_0_0.json")


def _event_lines(path: str) -> list[str]:
    lines: list[str] = []
    events = os.path.join(path, "events")
    for name in sorted(os.listdir(events)):
        with open(os.path.join(events, name)) as f:
            lines += [line for line in f if line.strip()]
    return lines
