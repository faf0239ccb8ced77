"""A checkpoint keeps rank 0's metrics, as in Ray Train ("only the metrics reported by the
rank 0 worker will be attached to the checkpoint"): the score attribute is checked there,
whichever rank passes the checkpoint, and only there."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
import v2_workloads

import cairn
from cairn import CheckpointConfig, ScalingConfig, Trainer

RunConfigFactory = Callable[..., cairn.RunConfig]
BEST_FIRST = CheckpointConfig(num_to_keep=1, checkpoint_score_attribute="loss",
                              checkpoint_score_order="min")


def test_a_score_only_another_rank_reports_fails_the_report_naming_rank_0(
        run_config: RunConfigFactory) -> None:
    # Rank 1 passes the checkpoint and the loss, rank 0 neither: retention would have no
    # score to rank by and would keep the latest checkpoint instead of the best one.
    config = run_config(checkpoint_config=BEST_FIRST)
    with pytest.raises(cairn.WorkerGroupError) as caught:
        Trainer(v2_workloads.score_on_one_rank,
                train_loop_config={"losses": [0.1, 0.5, 0.9], "score_rank": 1,
                                   "checkpoint_ranks": [1]},
                scaling_config=ScalingConfig(num_workers=2), run_config=config).fit()
    message = str(caught.value)
    assert ("report() on rank 0 (whose metrics the checkpoint of report 1 keeps, as in Ray "
            "Train) has no 'loss', the checkpoint_score_attribute") in message
    run = os.path.join(os.fspath(config.storage_path), "run")
    assert not any(name.startswith("checkpoint_") and
                   os.path.exists(os.path.join(run, name, "_cairn_manifest.json"))
                   for name in os.listdir(run))


def test_a_score_only_rank_0_reports_ranks_the_checkpoints_every_rank_passes(
        run_config: RunConfigFactory) -> None:
    # Every rank passes its shard; only rank 0 has the loss (a metric logged on rank zero
    # only): the checkpoints commit, ranked by rank 0's loss.
    config = run_config(checkpoint_config=BEST_FIRST)
    result = Trainer(v2_workloads.score_on_one_rank,
                     train_loop_config={"losses": [0.5, 0.1, 0.9], "score_rank": 0,
                                        "checkpoint_ranks": [0, 1]},
                     scaling_config=ScalingConfig(num_workers=2), run_config=config).fit()
    # The best (0.1) and, as always, the latest (0.9): 0.5 went.
    assert sorted(metrics["loss"] for _, metrics in result.best_checkpoints) == [0.1, 0.9]
    assert result.checkpoint is not None
    with result.checkpoint.as_directory() as directory:
        assert {"rank_0.txt", "rank_1.txt"} <= set(os.listdir(directory))
