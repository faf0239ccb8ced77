"""A failing rank does not cost the others the reports it already passed (issue 10, item
19): the surviving ranks get a short, bounded grace to finish the reports up to the failed
rank's last one; those commit, then the attempt is torn down. Real worker processes."""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import grace_workloads
import pytest
from invariants import run_dir

import cairn
from cairn import FailureConfig, ScalingConfig, Trainer, TrainingFailedError


def test_reports_the_failed_rank_passed_are_committed(
    run_config: Callable[..., cairn.RunConfig]
) -> None:
    config = run_config(failure_config=FailureConfig(max_failures=0))
    with pytest.raises(TrainingFailedError, match=r"\[rank 1\] RuntimeError: rank 1 fails "
                                                  r"after its third report"):
        Trainer(grace_workloads.rank1_fails_after_three_reports,
                train_loop_config={"steps": 6, "write_s": 0.4},
                scaling_config=ScalingConfig(num_workers=2), run_config=config).fit()
    with open(os.path.join(run_dir(config), "cairn_run.json")) as f:
        committed = [c["dir_name"] for c in json.load(f)["checkpoints"]]
    assert committed == ["checkpoint_000001", "checkpoint_000002", "checkpoint_000003"]
    result = cairn.Result.from_path(run_dir(config))
    for checkpoint, _ in result.best_checkpoints:
        checkpoint.verify()
