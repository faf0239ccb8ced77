"""``Result`` as Ray Train builds it, with real runs on local storage and on S3."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import api_workloads
import pyarrow.fs as pafs
import pytest

import cairn
from cairn import (
    Checkpoint,
    CheckpointConfig,
    Result,
    RunConfig,
    RunNotFoundError,
    ScalingConfig,
    Trainer,
    WorkerGroupError,
)


def test_result_builds_from_keywords_as_in_ray() -> None:
    result = Result(metrics={"iter": 0, "metric": 1.0}, checkpoint=Checkpoint("/bucket/path/ckpt0"),
                    error=None, path="/bucket/path")
    assert "metrics={'iter': 0, 'metric': 1.0}" in repr(result)
    assert "/bucket/path/ckpt0" in repr(result)
    assert result.best_checkpoints == [] and result.return_value is None
    assert isinstance(result.filesystem, pafs.LocalFileSystem)
    assert result.metrics_dataframe.empty and result.goodput.attempts == 0


def test_get_best_checkpoint() -> None:
    result = Result(
        metrics={}, checkpoint=None, error=None, path="/bucket/path",
        best_checkpoints=[(Checkpoint(f"/bucket/path/ckpt{i}"),
                           {"iter": i, "metric": float(i + 1), "val": {"loss": -i}})
                          for i in range(4)],
    )
    assert result.get_best_checkpoint(metric="metric", mode="max").path == "/bucket/path/ckpt3"
    assert result.get_best_checkpoint(metric="metric", mode="min").path == "/bucket/path/ckpt0"
    assert result.get_best_checkpoint("val/loss", "max").path == "/bucket/path/ckpt0"
    with pytest.raises(RuntimeError, match=r"Invalid metric name nope! You may choose from"):
        result.get_best_checkpoint("nope", "max")
    with pytest.raises(ValueError, match=r"Unsupported mode: best\. Please choose from "
                       r"\[\"min\", \"max\"\]"):
        result.get_best_checkpoint("metric", "best")
    empty = Result(metrics=None, checkpoint=None, error=None, path="/x")
    with pytest.raises(RuntimeError, match=r"No checkpoint exists in the trial directory!"):
        empty.get_best_checkpoint("metric", "max")


def _fit(storage_path: str, score: str | None, scores: dict[str, int] | None = None,
         fail: bool = False, **checkpoint: object) -> tuple[cairn.RunConfig, Result]:
    config = RunConfig(
        name="run", storage_path=storage_path,
        checkpoint_config=CheckpointConfig(checkpoint_score_attribute=score,
                                           **checkpoint),  # type: ignore[arg-type]
    )
    trainer = Trainer(api_workloads.scored_checkpoints,
                      train_loop_config={"iterations": 5, "scores": scores or {},
                                         "fail": fail},
                      scaling_config=ScalingConfig(num_workers=2), run_config=config)
    if fail:
        with pytest.raises(WorkerGroupError) as info:
            trainer.fit()
        assert info.value.run_path is None or "run" in info.value.run_path
        return config, Result.from_path(os.path.join(storage_path, "run"),
                                        checkpoint_config=config.checkpoint_config)
    return config, trainer.fit()


def _iters(result: Result) -> list[int]:
    return [api_workloads.load_dict(c)["iter"] for c, _ in result.best_checkpoints]


def test_ray_result_restore_pattern(tmp_path: Path) -> None:
    """Ray's test_result_restore on local storage: the run fails after its last report."""
    _, result = _fit(str(tmp_path), "metric_a", fail=True, num_to_keep=3,
                     checkpoint_score_order="max")
    assert result.checkpoint is not None
    assert len(result.best_checkpoints) == 3
    best_a = result.get_best_checkpoint(metric="metric_a", mode="max")
    assert best_a is not None and api_workloads.load_dict(best_a)["iter"] == 4
    best_b = result.get_best_checkpoint(metric="metric_b", mode="max")
    assert best_b is not None and api_workloads.load_dict(best_b)["iter"] == 2
    with pytest.raises(RuntimeError, match=r"Invalid metric name.*"):
        result.get_best_checkpoint(metric="invalid_metric", mode="max")
    for trailing in ("", "/"):
        again = Result.from_path(str(tmp_path / "run") + trailing)
        assert again.path == str(tmp_path / "run") and len(again.best_checkpoints) == 3
    assert Result.from_path(tmp_path / "run").checkpoint is not None


def test_best_checkpoints_in_ray_order(tmp_path: Path) -> None:
    scores = {"0": 5, "1": 9, "2": 1, "3": 9, "4": 0}
    _, result = _fit(str(tmp_path / "max"), "metric_a", scores)
    # Worst to best; of two equal scores the earlier report comes first.
    assert _iters(result) == [4, 2, 0, 1, 3]
    _, result = _fit(str(tmp_path / "min"), "metric_a", scores, checkpoint_score_order="min")
    assert _iters(result) == [1, 3, 0, 2, 4]
    _, result = _fit(str(tmp_path / "none"), None, scores)
    assert _iters(result) == [0, 1, 2, 3, 4]  # report order without a score attribute
    # from_path orders as fit() did: by the retention settings the run recorded.
    assert _iters(Result.from_path(tmp_path / "max" / "run")) == [4, 2, 0, 1, 3]
    assert _iters(Result.from_path(tmp_path / "min" / "run")) == [1, 3, 0, 2, 4]
    assert _iters(Result.from_path(tmp_path / "none" / "run")) == [0, 1, 2, 3, 4]
    # An explicit checkpoint config still wins.
    config = CheckpointConfig(checkpoint_score_attribute="metric_a", checkpoint_score_order="min")
    assert _iters(Result.from_path(tmp_path / "max" / "run", checkpoint_config=config)) == [
        1, 3, 0, 2, 4]


def test_result_keeps_cairn_extras(tmp_path: Path) -> None:
    _, result = _fit(str(tmp_path), None)
    assert result.path == str(tmp_path / "run") and result.uri == str(tmp_path / "run")
    assert result.checkpoint is not None and result.checkpoint.path.startswith(result.path)
    frame = result.metrics_dataframe
    assert len(frame) == 10 and list(frame["metric_a"])[-1] == 4
    assert result.goodput.attempts == 1 and result.error is None


@pytest.mark.parametrize("path_type", [str, Path])
def test_from_path_of_a_missing_run_is_a_runtime_error(tmp_path: Path,
                                                       path_type: Callable[[str], object]) -> None:
    missing = path_type(str(tmp_path / "nonexistent_experiment"))
    with pytest.raises(RuntimeError, match=r"Experiment folder .* doesn't exist!") as info:
        Result.from_path(missing)  # type: ignore[arg-type]
    assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, RunNotFoundError)
    existing = tmp_path / "existing_experiment"
    existing.mkdir()
    # Ray's wording first (a ported test matches it), then Cairn's advice and the path.
    with pytest.raises(RuntimeError, match=r"Failed to restore the Result object: cairn_run\.json "
                       r"doesn't exist in the experiment folder\. Make sure that this is an output "
                       r"directory created by a Ray Train run, here a Cairn run: the directory "
                       r"RunConfig\(storage_path=\.\.\., name=\.\.\.\) points to\. "
                       r".*existing_experiment is not one\.$"):
        Result.from_path(path_type(str(existing)))  # type: ignore[arg-type]


def test_result_on_s3_is_a_path_inside_its_filesystem(
    s3_uri_factory: Callable[[str], str]
) -> None:
    uri = s3_uri_factory("results")
    base = uri.split("?")[0]
    _, result = _fit(uri, "metric_a", num_to_keep=2)
    bucket_path = base[len("s3://"):] + "/run"
    assert result.path == bucket_path
    assert isinstance(result.filesystem, pafs.S3FileSystem)
    assert result.checkpoint is not None and result.checkpoint.path.startswith(result.path)
    for checkpoint, _ in result.best_checkpoints:
        assert checkpoint.path.startswith(result.path + "/")
    assert result.uri is not None and result.uri.startswith(base + "/run")
    # The URI keeps what a new process needs to reach the store (the credentials come
    # from the environment here).
    assert "endpoint_override" in result.uri
    # Ray's two ways back: the URI, or the path with the result's filesystem.
    by_uri = Result.from_path(result.uri)
    by_fs = Result.from_path(result.path, storage_filesystem=result.filesystem)
    for again in (by_uri, by_fs):
        assert again.path == result.path
        assert [c.path for c, _ in again.best_checkpoints] == sorted(
            c.path for c, _ in result.best_checkpoints)
        assert again.checkpoint is not None
        assert api_workloads.load_dict(again.checkpoint) == {"iter": 4}
    missing = uri.replace("/results-", "/missing-")
    with pytest.raises(RuntimeError, match=r"Experiment folder .* doesn't exist!"):
        Result.from_path(missing)


def test_result_uri_carries_no_credentials(s3_uri_factory: Callable[[str], str]) -> None:
    uri = s3_uri_factory("secret").replace("s3://", "s3://testing:TOPSECRETVALUE@")
    result = Trainer(api_workloads.scored_checkpoints, train_loop_config={"iterations": 1},
                     scaling_config=ScalingConfig(num_workers=1),
                     run_config=RunConfig(name="run", storage_path=uri)).fit()
    assert result.uri is not None and "TOPSECRETVALUE" not in result.uri
    assert "TOPSECRETVALUE" not in repr(result)
    assert result.uri.startswith(uri.split("?")[0].replace("testing:TOPSECRETVALUE@", "")
                                 + "/run?")
    # It still names the run: the credentials come from the environment.
    assert Result.from_path(result.uri).checkpoint is not None
