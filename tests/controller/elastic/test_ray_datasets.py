"""Trainer(datasets=...) and get_dataset_shard(): Ray Data shards, one per worker."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator

import pytest

import cairn
from cairn import ConfigError, ScalingConfig, Trainer
from cairn._src.wire.datasets import DatasetShards

RunConfigFactory = Callable[..., cairn.RunConfig]


def test_datasets_need_the_ray_backend() -> None:
    with pytest.raises(ConfigError,
                       match=r"Trainer\(datasets=\{'train': \.\.\.\}\) needs the Ray backend, "
                       r"and ScalingConfig.backend='local'"):
        Trainer(lambda: None, datasets={"train": object()})


def test_datasets_must_be_a_dict_of_names() -> None:
    with pytest.raises(ConfigError, match=r"must be a dict of non-empty names to "
                       r"ray.data.Dataset objects"):
        Trainer(lambda: None, datasets=[1, 2])  # type: ignore[arg-type]


def test_a_name_the_trainer_does_not_have_is_refused_naming_the_ones_it_has() -> None:
    shards = DatasetShards(("train", "eval"), b"")
    with pytest.raises(ConfigError,
                       match=r"get_dataset_shard\('nope'\): the Trainer has no dataset named "
                       r"'nope'; it has 'train', 'eval' \(Trainer\(datasets=\.\.\.\)\)\."):
        shards.get("nope")
    with pytest.raises(ConfigError, match=r"without a name needs exactly one dataset; the "
                       r"Trainer has 2: 'train', 'eval'"):
        shards.get(None)
    with pytest.raises(ConfigError, match=r"get_dataset_shard\('train'\): the Trainer was "
                       r"given no datasets"):
        DatasetShards((), None).get("train")


ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")

import dataset_workloads  # noqa: E402


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    # A cluster of its own ("local"), never one another process started on this machine;
    # four logical CPUs: two for the workers, two for Ray Data's tasks.
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False,
             _temp_dir=tempfile.mkdtemp(prefix="cairn-ray-"))
    yield
    ray.shutdown()


def _read(scratch: str, attempt: int, rank: int) -> dict[str, object]:
    with open(os.path.join(scratch, f"attempt_{attempt}_rank_{rank}.json")) as f:
        return json.load(f)


@pytest.mark.slow
def test_each_worker_streams_its_own_equal_shard(
    ray_cluster: None, run_config: RunConfigFactory, scratch: str
) -> None:
    result = Trainer(dataset_workloads.read_shard, train_loop_config={"scratch": scratch},
                     datasets={"train": ray.data.range(40)},
                     scaling_config=ScalingConfig(num_workers=2, backend="ray"),
                     run_config=run_config()).fit()
    assert result.error is None
    shards = [set(_read(scratch, 0, rank)["ids"]) for rank in (0, 1)]  # type: ignore[arg-type]
    assert [len(s) for s in shards] == [20, 20]
    assert shards[0] | shards[1] == set(range(40))


@pytest.mark.slow
def test_a_restart_splits_the_datasets_again(
    ray_cluster: None, run_config: RunConfigFactory, scratch: str
) -> None:
    result = Trainer(dataset_workloads.read_shard,
                     train_loop_config={"scratch": scratch, "crash": True},
                     datasets={"train": ray.data.range(40)},
                     scaling_config=ScalingConfig(num_workers=2, backend="ray"),
                     run_config=run_config(failure_config=cairn.FailureConfig(max_failures=1))
                     ).fit()
    assert result.error is None
    again = [set(_read(scratch, 1, rank)["ids"]) for rank in (0, 1)]  # type: ignore[arg-type]
    assert again[0] | again[1] == set(range(40)) and not again[0] & again[1]


@pytest.mark.slow
def test_an_unknown_dataset_name_fails_the_run_naming_the_datasets(
    ray_cluster: None, run_config: RunConfigFactory, scratch: str
) -> None:
    with pytest.raises(cairn.TrainingFailedError,
                       # Either rank may fail first; the other may follow within the grace.
                       match=r"\[ranks? [01, ]+\] ConfigError: get_dataset_shard\('nope'\): the "
                       r"Trainer has no dataset named 'nope'; it has 'train'"):
        Trainer(dataset_workloads.read_shard,
                train_loop_config={"scratch": scratch, "name": "nope"},
                datasets={"train": ray.data.range(8)},
                scaling_config=ScalingConfig(num_workers=2, backend="ray"),
                run_config=run_config(failure_config=cairn.FailureConfig(max_failures=2))
                ).fit()
