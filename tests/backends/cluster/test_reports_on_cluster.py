"""Report semantics on a 3-node Ray cluster, the same as with local worker processes.

SYNC, ASYNC and NO_UPLOAD reports and retention, with the local backend's workloads and
checks; ``backend`` is parametrized where the local run is cheap, so one test body holds
both backends to the same contract.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import pytest
import workloads
from workloads import run_dir

import cairn
from cairn import CheckpointConfig, FailureConfig, ScalingConfig, Trainer

from .conftest import RayCluster

pytestmark = pytest.mark.slow

RunConfigFactory = Callable[..., cairn.RunConfig]
BACKENDS = ["local", "ray"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["SYNC", "ASYNC"])
def test_checkpoint_reports_merge_ranks_from_every_node(
    mode: str, backend: str, cluster: RayCluster, run_config: RunConfigFactory, scratch: str
) -> None:
    config = run_config()
    result = Trainer(
        workloads.checkpoint_every_step,
        train_loop_config={"steps": 3, "mode": mode, "scratch": scratch},
        scaling_config=ScalingConfig(num_workers=3, backend=backend),
        run_config=config,
    ).fit()
    assert result.checkpoint is not None
    assert result.checkpoint.path == os.path.join(run_dir(config), "checkpoint_000003")
    assert sorted(n for n in os.listdir(run_dir(config)) if n.startswith("checkpoint_")) == [
        "checkpoint_000001", "checkpoint_000002", "checkpoint_000003"]
    manifest = result.checkpoint.get_manifest()
    assert manifest is not None
    assert set(manifest.files) == {f"rank_{r}.json" for r in range(3)}
    assert manifest.ranks == (0, 1, 2)
    assert manifest.report_index == 3
    assert manifest.metrics == {"step": 2, "score": 2}
    result.checkpoint.verify()
    with result.checkpoint.as_directory() as d, open(os.path.join(d, "rank_2.json")) as f:
        assert json.load(f) == {"step": 2, "rank": 2}
    if mode == "SYNC":
        # A SYNC report returned after its commit, and every rank saw that checkpoint.
        for step in range(3):
            seen = {open(os.path.join(scratch, f"latest_{rank}_{step}")).read()
                    for rank in range(3)}
            assert seen == {os.path.join(run_dir(config), f"checkpoint_{step + 1:06d}")}


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_upload_reference_survives_a_worker_exit(
    backend: str, cluster: RayCluster, run_config: RunConfigFactory, tmp_path: os.PathLike[str]
) -> None:
    target = os.path.join(os.fspath(tmp_path), "my_store")
    config = run_config(failure_config=FailureConfig(max_failures=1),
                        checkpoint_config=CheckpointConfig(num_to_keep=1))
    result = Trainer(
        workloads.no_upload_reference,
        train_loop_config={"steps": 4, "target": target, "crash_at": 1},
        scaling_config=ScalingConfig(num_workers=2, backend=backend),
        run_config=config,
    ).fit()
    assert result.checkpoint is not None
    assert result.checkpoint.path == os.path.join(target, "step_3")
    assert result.checkpoint.get_metadata() == {"before": 3, "step": 3}
    result.checkpoint.verify()
    manifest = result.checkpoint.get_manifest()
    assert manifest is not None and set(manifest.files) == {"rank_0.bin", "rank_1.bin"}
    # Retention forgot the older references but did not delete the user's data.
    assert sorted(n for n in os.listdir(target) if n.startswith("step_")) == [
        "step_0", "step_1", "step_2", "step_3"]
    assert result.goodput.failures == 1
    # Every rank exited right after step 1 was committed: resumed from it.
    assert list(result.metrics_dataframe["step"]) == [0, 1, 2, 3]


def test_retention_keeps_the_best_and_the_latest(
    cluster: RayCluster, run_config: RunConfigFactory
) -> None:
    config = run_config(checkpoint_config=CheckpointConfig(
        num_to_keep=2, checkpoint_score_attribute="score", checkpoint_score_order="max"))
    scores = {"0": 5, "1": 9, "2": 1, "3": 7, "4": 0}
    result = Trainer(
        workloads.checkpoint_every_step,
        train_loop_config={"steps": 5, "scores": scores},
        scaling_config=ScalingConfig(num_workers=3, backend="ray"),
        run_config=config,
    ).fit()
    kept = sorted(n for n in os.listdir(run_dir(config)) if n.startswith("checkpoint_"))
    # Best two by score: steps 1 (9) and 3 (7); plus the latest, step 4.
    assert kept == ["checkpoint_000002", "checkpoint_000004", "checkpoint_000005"]
    assert [m["score"] for _, m in result.best_checkpoints] == [0, 7, 9]
    assert result.checkpoint is not None
    assert result.checkpoint.path.endswith("checkpoint_000005")
