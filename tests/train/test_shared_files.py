"""The same file from several ranks (Ray's quickstart), and checkpoint_dir_name without a
checkpoint, with real worker processes."""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import pytest
import v2_workloads

import cairn
from cairn import ScalingConfig, Trainer, TrainingFailedError
from cairn._src.run.segment_log import read_log
from cairn._src.storage.location import resolve
from cairn._src.storage.retry import RetryPolicy

RunConfigFactory = Callable[..., cairn.RunConfig]


def run_dir(config: cairn.RunConfig) -> str:
    assert config.storage_path is not None and config.name is not None
    return os.path.join(os.fspath(config.storage_path), config.name)


def commit_events(config: cairn.RunConfig) -> list[dict[str, object]]:
    events = read_log(resolve(run_dir(config)).join("events"), RetryPolicy())
    return [e for e in events if e.get("type") == "commit"]


@pytest.mark.parametrize("mode", ["SYNC", "ASYNC"])
def test_identical_copies_are_stored_once_and_uploaded_once(
    mode: str, run_config: RunConfigFactory
) -> None:
    config = run_config()
    result = Trainer(v2_workloads.every_rank_saves_model,
                     train_loop_config={"content": "same", "mode": mode},
                     scaling_config=ScalingConfig(num_workers=2), run_config=config).fit()
    assert result.checkpoint is not None
    with result.checkpoint.as_directory() as d:
        assert sorted(n for n in os.listdir(d) if not n.startswith("_cairn")) == [
            "model.pt", "rank_0.txt", "rank_1.txt"]
        assert open(os.path.join(d, "model.pt"), "rb").read() == b"weights-1"
    manifest = json.load(open(os.path.join(run_dir(config), "checkpoint_000002",
                                           "_cairn_manifest.json")))
    assert manifest["ranks"] == [0, 1]
    # One copy of model.pt was written per report: the other rank uploaded only its own file.
    one_copy = len(b"weights-0") + 2
    assert [e["bytes"] for e in commit_events(config)] == [one_copy, one_copy]


@pytest.mark.parametrize(
    ("content", "detail"),
    [("differ", r"different checksums"), ("sizes", r"rank 0: 9 bytes, rank 1: 16 bytes")],
)
def test_different_copies_fail_naming_both_ranks_and_the_path(
    content: str, detail: str, run_config: RunConfigFactory
) -> None:
    config = run_config(failure_config=cairn.FailureConfig(max_failures=2))
    with pytest.raises(TrainingFailedError,
                       match=r"CheckpointCollisionError: Ranks 0 and 1 both wrote 'model.pt' "
                             r"into the checkpoint of report 1 with different content \("
                             + detail + r"\); nothing was overwritten") as info:
        Trainer(v2_workloads.every_rank_saves_model, train_loop_config={"content": content},
                scaling_config=ScalingConfig(num_workers=2), run_config=config).fit()
    # A mistake in the training code: no restart spends the failure budget on it.
    assert cairn.Result.from_path(run_dir(config)).goodput.attempts == 1
    assert "[ranks 0, 1]" in str(info.value) or "[rank" in str(info.value)
    # Nothing committed, nothing left behind: never a silent overwrite.
    assert [n for n in os.listdir(run_dir(config)) if n.startswith("checkpoint")] == []
    assert commit_events(config) == []


@pytest.mark.parametrize(("delete", "rename"), [(False, False), (True, True)])
def test_ranks_reporting_one_directory_commit_every_complete_shard_once(
    delete: bool, rename: bool, run_config: RunConfigFactory, tmp_path: os.PathLike[str]
) -> None:
    # Rank 1 reports the directory while rank 0's shard is still empty. Once every rank
    # has reported (as Ray Train's report waits for all ranks), rank 0 lists the directory
    # again and uploads it whole, in place of what rank 1 uploaded at its report.
    config = run_config()
    shared = os.path.join(os.fspath(tmp_path), "shared")
    result = Trainer(v2_workloads.shards_in_one_directory,
                     train_loop_config={"dir": shared, "delete": delete, "rename": rename},
                     scaling_config=ScalingConfig(num_workers=2), run_config=config).fit()
    assert [c.path.rsplit("/", 1)[1] for c, _ in result.best_checkpoints] == [
        "checkpoint_000001", "checkpoint_000002"]
    for epoch, (checkpoint, _) in enumerate(result.best_checkpoints):
        with checkpoint.as_directory() as d:
            assert {n: open(os.path.join(d, n), "rb").read() for n in os.listdir(d)
                    if not n.startswith("_cairn")} == {
                f"shard_{r}": b"shard %d of epoch %d" % (r, epoch) for r in (0, 1)}
    manifest = json.load(open(os.path.join(run_dir(config), "checkpoint_000001",
                                           "_cairn_manifest.json")))
    assert manifest["ranks"] == [0, 1]
    # A temporary file rank 1 uploaded at its report, renamed since, is not left behind.
    assert sorted(os.listdir(os.path.join(run_dir(config), "checkpoint_000001"))) == [
        "_cairn_manifest.json", "shard_0", "shard_1"]
    # Rank 1's upload at its report (its shard, and rank 0's as far as it was written
    # then), then what changed since, once the directory is complete: rank 1's shard,
    # unchanged, is hashed again but not written twice. So each shard's bytes once, in
    # every order of the two ranks' writes and uploads.
    size = len(b"shard 0 of epoch 0")
    assert [e["bytes"] for e in commit_events(config)] == [2 * size, 2 * size]
    # delete_local_checkpoint_after_upload: gone once committed, not before the upload.
    assert sorted(os.listdir(shared)) == sorted(
        ([] if delete else ["epoch_0", "epoch_1"]) + ["rank_1_reported_0", "rank_1_reported_1"])


def test_dir_name_without_a_checkpoint_is_accepted(run_config: RunConfigFactory) -> None:
    config = run_config()
    result = Trainer(v2_workloads.name_without_checkpoint,
                     scaling_config=ScalingConfig(num_workers=2), run_config=config).fit()
    assert result.checkpoint is not None and result.checkpoint.path.endswith("/epoch_1")
    assert [os.path.basename(c.path) for c, _ in result.best_checkpoints] == ["epoch_0",
                                                                             "epoch_1"]


def test_dir_name_without_a_checkpoint_that_disagrees_is_refused(
    run_config: RunConfigFactory,
) -> None:
    with pytest.raises(TrainingFailedError,
                       match=r"Ranks disagree on checkpoint_dir_name for report 1: rank \d gave "
                             r"'(epoch|other)_0'( \(without a checkpoint\))?, rank \d gave "
                             r"'(epoch|other)_0'"):
        Trainer(v2_workloads.name_without_checkpoint, train_loop_config={"agree": False},
                scaling_config=ScalingConfig(num_workers=2), run_config=run_config()).fit()


def test_a_collision_the_train_function_caught_is_not_raised_again(
    run_config: RunConfigFactory,
) -> None:
    # The SYNC report() raises the refusal, found once both ranks uploaded; the train
    # function catches it, and its next report() goes through rather than raise it again.
    config = run_config()
    result = Trainer(v2_workloads.collision_caught_then_metrics,
                     scaling_config=ScalingConfig(num_workers=2), run_config=config).fit()
    assert result.error is None
    assert result.return_value == {"1": "CheckpointCollisionError", "2": "reported"}
    assert result.metrics == {"epoch": 1}
    assert result.checkpoint is None
    assert commit_events(config) == []
    # What the ranks uploaded for the refused report never commits: the run's end deletes
    # it (no later attempt failure would), and nothing else is left in the run directory.
    run = os.path.join(os.fspath(config.storage_path), "run")
    assert [n for n in os.listdir(run) if n.startswith("checkpoint_")] == []


def test_refused_references_in_the_run_directory_stay(run_config: RunConfigFactory) -> None:
    # The user's own data, registered by reference under the run directory: a refused
    # report leaves it where it is, at the run's end as after a failed attempt.
    config = run_config()
    result = Trainer(v2_workloads.references_refused_then_metrics,
                     scaling_config=ScalingConfig(num_workers=2), run_config=config).fit()
    assert result.error is None
    said = result.return_value
    assert said["1"] == "ReportError" or said["2"] == "ReportError", said
    assert result.checkpoint is None
    run = os.path.join(os.fspath(config.storage_path), "run")
    for name, rank in (("step_10", 0), ("step_10_rank1", 1)):
        with open(os.path.join(run, name, "model.pt"), "rb") as f:
            assert f.read() == b"weights-%d" % rank
