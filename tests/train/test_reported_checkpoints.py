"""get_all_reported_checkpoints() with real worker processes."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import pytest
import v2_workloads

import cairn
from cairn import CheckpointConfig, FailureConfig, ScalingConfig, Trainer, TrainingFailedError

RunConfigFactory = Callable[..., cairn.RunConfig]


def listed(scratch: str, name: str) -> list[dict[str, Any]]:
    with open(os.path.join(scratch, name)) as f:
        value: list[dict[str, Any]] = json.load(f)
    return value


@pytest.mark.parametrize("mode", ["SYNC", "ASYNC"])
def test_every_rank_sees_the_kept_checkpoints_after_each_report(
    mode: str, run_config: RunConfigFactory, scratch: str
) -> None:
    config = run_config(checkpoint_config=CheckpointConfig(
        num_to_keep=2, checkpoint_score_attribute="score"))
    scores = [0.5, 0.9, 0.1]
    Trainer(v2_workloads.reporting_and_listing,
            train_loop_config={"epochs": 3, "scores": scores, "scratch": scratch, "mode": mode},
            scaling_config=ScalingConfig(num_workers=2), run_config=config).fit()
    for rank in (0, 1):  # rank 1 passes no checkpoint and sees rank 0's
        first = listed(scratch, f"list_{rank}_0.json")
        assert first == [{"name": "checkpoint_000001", "status": "COMMITTED",
                          "metrics": {"epoch": 0, "score": 0.5}}]
        assert [i["name"] for i in listed(scratch, f"list_{rank}_1.json")] == [
            "checkpoint_000001", "checkpoint_000002"]
        # Retention kept the best two and the latest; worst to best (0.1, 0.5, 0.9), as in Ray.
        assert [i["name"] for i in listed(scratch, f"list_{rank}_2.json")] == [
            "checkpoint_000003", "checkpoint_000001", "checkpoint_000002"]


def test_a_restarted_worker_sees_the_checkpoints_of_the_earlier_attempt(
    run_config: RunConfigFactory, scratch: str
) -> None:
    config = run_config(failure_config=FailureConfig(max_failures=1))
    result = Trainer(v2_workloads.reporting_and_listing,
                     train_loop_config={"epochs": 3, "scores": [1, 2, 3], "scratch": scratch,
                                        "crash_at": 1},
                     scaling_config=ScalingConfig(num_workers=2), run_config=config).fit()
    assert result.goodput.attempts == 2
    for rank in (0, 1):
        at_start = listed(scratch, f"restart_{rank}.json")
        assert [i["name"] for i in at_start] == ["checkpoint_000001", "checkpoint_000002"]
        assert {i["status"] for i in at_start} == {"COMMITTED"}
    # Report 3 of the first attempt never committed; numbering goes on with report 4.
    assert [i["name"] for i in listed(scratch, "list_0_2.json")] == [
        "checkpoint_000001", "checkpoint_000002", "checkpoint_000004"]


@pytest.mark.parametrize(
    ("case", "message"),
    [("mode", r"get_all_reported_checkpoints\(consistency_mode='LATEST'\) is not one of "
              r"'COMMITTED', 'VALIDATED'"),
     ("timeout", r"get_all_reported_checkpoints\(timeout_s=-1\) must be None")],
)
def test_bad_arguments(case: str, message: str, run_config: RunConfigFactory) -> None:
    with pytest.raises(TrainingFailedError, match=message):
        Trainer(v2_workloads.bad_reported_call, train_loop_config={"case": case},
                run_config=run_config()).fit()


def test_outside_a_worker() -> None:
    with pytest.raises(cairn.ReportError, match=r"cairn.get_all_reported_checkpoints\(\) was "
                                                r"called outside a Cairn worker"):
        cairn.get_all_reported_checkpoints()
