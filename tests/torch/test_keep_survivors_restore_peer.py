"""The peer the event log names for a replacement rank's restore with three ranks
(FailureConfig(keep_survivors=True), real processes, real kill -9, gloo): the one whose
copy it restored from, as planned, not the kept rank that sent only its own small file."""

from __future__ import annotations

import json
import os
from typing import Any

import survivor_workloads

from cairn import CheckpointConfig, FailureConfig, ScalingConfig
from cairn._src.goodput.timeline import build_timeline
from cairn.torch import TorchTrainer


def _events(path: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    directory = os.path.join(path, "events")
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name)) as f:
            events += [json.loads(line) for line in f if line.strip()]
    return events


def test_the_replacement_s_restore_names_the_peer_it_restored_from(
    run_config: Any, scratch: str,
) -> None:
    result = TorchTrainer(
        survivor_workloads.train,
        train_loop_config={"epochs": 3, "every": 5, "scratch": scratch, "ballast_mib": 0,
                           "faults": {"0": {"rank": 2, "step": 13, "kind": "kill"}}},
        scaling_config=ScalingConfig(num_workers=3),
        run_config=run_config(name="three", checkpoint_config=CheckpointConfig(num_to_keep=2),
                              failure_config=FailureConfig(max_failures=1,
                                                           keep_survivors=True)),
    ).fit()
    assert result.error is None
    events = _events(result.path)
    planned = {e["rank"]: e for e in events if e["type"] == "restore_planned"}
    restored = {e["rank"]: e for e in events if e["type"] == "restored"}
    assert planned[2]["kind"] == "peer" and planned[2]["peer"] == 0, planned
    assert restored[2]["kind"] == "peer+driver" and restored[2]["peer"] == 0, restored
    # The goodput timeline's lane says the same.
    lanes = {(lane.attempt, lane.rank): lane for lane in build_timeline(events).lanes}
    assert lanes[1, 2].restored_from == "peer rank 0+driver", lanes[1, 2]
    assert lanes[1, 2].label.endswith("· from peer rank 0+driver")
