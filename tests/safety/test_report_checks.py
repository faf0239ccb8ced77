"""A report with a name Cairn needs, or metrics nested too deeply, fails the run at once
as a fatal error, in a real run (issue 10, items 3 and 11)."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
import safety_workloads
from guards import bounded

import cairn
from cairn import FailureConfig, ScalingConfig, Trainer, TrainingFailedError

RunConfigFactory = Callable[..., cairn.RunConfig]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"depth": 100_000},
         r"report\(metrics=\.\.\.\) is nested more than 64 levels deep"),
        ({"dir_name": "checkpoint_000003"},
         r"report\(checkpoint_dir_name='checkpoint_000003'\) has the form of the names Cairn "
         r"gives checkpoints itself"),
        ({"dir_name": "ckpt\n"},
         r"report\(checkpoint_dir_name='ckpt\\n'\) is not a safe directory name"),
        ({"dir_name": "lease.json"},
         r"report\(checkpoint_dir_name='lease\.json'\) names one of Cairn's own entries"),
    ],
    ids=["deep_metrics", "default_looking_name", "trailing_newline", "reserved_name"],
)
def test_a_bad_report_is_fatal_and_not_retried(
    config: dict[str, object], message: str, run_config: RunConfigFactory, scratch: str
) -> None:
    trainer = Trainer(safety_workloads.report_with,
                      train_loop_config={**config, "scratch": scratch},
                      scaling_config=ScalingConfig(num_workers=2),
                      run_config=run_config(failure_config=FailureConfig(max_failures=3)))
    with pytest.raises(TrainingFailedError, match=message):
        bounded(trainer.fit)
    # Fatal: the failure budget is not spent on retries.
    assert sorted(os.listdir(scratch)) == ["attempt_0"]
