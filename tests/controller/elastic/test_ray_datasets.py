"""Trainer(datasets=...), DataConfig and get_dataset_shard(): Ray Data shards, one per
worker, on the Ray backend and on the local one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from ray_clusters import own_ray_cluster

import cairn
from cairn import ConfigError, DataConfig, ScalingConfig, Trainer
from cairn._src.wire.datasets import DatasetShards

RunConfigFactory = Callable[..., cairn.RunConfig]


def test_a_dataset_that_is_not_a_ray_dataset_is_refused_naming_it() -> None:
    pytest.importorskip("ray.data")
    with pytest.raises(ConfigError,
                       match=r"Trainer\(datasets=\{'train': object\}\): datasets\['train'\] must "
                       r"be a ray.data.Dataset \(or a function that returns one\), not object"):
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
    yield from own_ray_cluster(num_cpus=4)


def _read(scratch: str, attempt: int, rank: int) -> dict[str, object]:
    with open(os.path.join(scratch, f"attempt_{attempt}_rank_{rank}.json")) as f:
        return json.load(f)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["local", "ray"])
def test_each_worker_streams_its_own_equal_shard(
    ray_cluster: None, run_config: RunConfigFactory, scratch: str, backend: str
) -> None:
    result = Trainer(dataset_workloads.read_shard, train_loop_config={"scratch": scratch},
                     datasets={"train": ray.data.range(40)},
                     scaling_config=ScalingConfig(num_workers=2, backend=backend),
                     run_config=run_config()).fit()
    assert result.error is None
    shards = [set(_read(scratch, 0, rank)["ids"]) for rank in (0, 1)]  # type: ignore[arg-type]
    assert [len(s) for s in shards] == [20, 20]
    assert shards[0] | shards[1] == set(range(40))


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["local", "ray"])
def test_a_restart_splits_the_datasets_again(
    ray_cluster: None, run_config: RunConfigFactory, scratch: str, backend: str
) -> None:
    # The local workers are no Ray actors: rank 1's os._exit kills a Ray driver of its
    # own, and the next attempt's workers connect again to a fresh split.
    result = Trainer(dataset_workloads.read_shard,
                     train_loop_config={"scratch": scratch, "crash": True},
                     datasets={"train": ray.data.range(40)},
                     scaling_config=ScalingConfig(num_workers=2, backend=backend),
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


@pytest.mark.slow
def test_local_workers_attach_to_the_driver_s_ray_and_leave_it_running(
    ray_cluster: None, run_config: RunConfigFactory, scratch: str
) -> None:
    from ray.data import DataContext

    # DataConfig as Ray's: "train" is split, "eval" goes whole to every worker; Ray Data's
    # settings as the Trainer was built reach the workers.
    DataContext.get_current().set_config("cairn_test_marker", "from-the-driver")
    try:
        trainer = Trainer(dataset_workloads.read_every_dataset,
                          train_loop_config={"scratch": scratch, "names": ["train", "eval"]},
                          datasets={"train": ray.data.range(40),
                                    "eval": lambda: ray.data.range(6)},
                          dataset_config=DataConfig(datasets_to_split=["train"]),
                          scaling_config=ScalingConfig(num_workers=2),
                          run_config=run_config())
    finally:
        DataContext.get_current().remove_config("cairn_test_marker")
    assert trainer.fit().error is None
    seen = [_read(scratch, 0, rank) for rank in (0, 1)]
    for rank_seen in seen:
        assert rank_seen["marker"] == "from-the-driver"
        # Every epoch of a shard streams the same rows; the unsplit dataset is whole.
        train = rank_seen["train"]
        assert len(train) == 2 and train[0] == train[1] and len(train[0]) == 20  # type: ignore[arg-type]
        assert rank_seen["eval"] == [list(range(6))] * 2
    assert set(seen[0]["train"][0]) | set(seen[1]["train"][0]) == set(range(40))  # type: ignore[index]
    # The driver's own Ray instance (this module's) was attached to, not shut down.
    assert ray.is_initialized()


class EverythingToEveryRank(DataConfig):
    """Ray's extension point: a subclass builds each worker's iterators itself."""

    def configure(self, datasets, world_size, worker_handles, worker_node_ids,  # type: ignore[no-untyped-def]
                  **kwargs):
        assert worker_handles is None and len(worker_node_ids) == world_size
        return [{name: ds.iterator() for name, ds in datasets.items()}
                for _ in range(world_size)]


class NotOnePerRank(DataConfig):
    def configure(self, datasets, world_size, worker_handles, worker_node_ids,  # type: ignore[no-untyped-def]
                  **kwargs):
        return [{}]


@pytest.mark.slow
def test_a_data_config_subclass_builds_the_iterators(
    ray_cluster: None, run_config: RunConfigFactory, scratch: str
) -> None:
    result = Trainer(dataset_workloads.read_shard, train_loop_config={"scratch": scratch},
                     datasets={"train": ray.data.range(10)},
                     dataset_config=EverythingToEveryRank(),
                     scaling_config=ScalingConfig(num_workers=2),
                     run_config=run_config()).fit()
    assert result.error is None
    assert [sorted(_read(scratch, 0, rank)["ids"]) for rank in (0, 1)] == [  # type: ignore[type-var]
        list(range(10))] * 2


def test_a_configure_that_does_not_give_every_rank_its_iterators_is_named(
    ray_cluster: None, run_config: RunConfigFactory, scratch: str
) -> None:
    with pytest.raises(ConfigError, match=r"NotOnePerRank.configure\(\) must return a list of "
                       r"2 dicts \(one per worker\), each with the dataset 'train'; it "
                       r"returned list of 1\."):
        Trainer(dataset_workloads.read_shard, train_loop_config={"scratch": scratch},
                datasets={"train": ray.data.range(10)}, dataset_config=NotOnePerRank(),
                scaling_config=ScalingConfig(num_workers=2),
                run_config=run_config()).fit()


def test_a_ray_data_config_is_taken_as_it_is(ray_cluster: None) -> None:
    import ray.train

    config = ray.train.DataConfig(datasets_to_split=["a"])
    trainer = Trainer(lambda: None, datasets={"a": ray.data.range(2), "b": ray.data.range(2)},
                      dataset_config=config)
    assert trainer.data_config is config
    with pytest.raises(ConfigError, match=r"DataConfig\(datasets_to_split=\['c'\]\) names 'c', "
                       r"which Trainer\(datasets=...\) does not have; it has 'a'"):
        Trainer(lambda: None, datasets={"a": ray.data.range(2)},
                dataset_config=ray.train.DataConfig(datasets_to_split=["c"]))


STARTS_ITS_OWN_RAY = """
import json, sys
import ray
import dataset_workloads
from cairn import RunConfig, ScalingConfig, Trainer

# A dataset built by a function: nothing has started Ray in this process before fit().
result = Trainer(dataset_workloads.read_shard, train_loop_config={"scratch": sys.argv[1]},
                 datasets={"train": lambda: ray.data.range(10)},
                 scaling_config=ScalingConfig(num_workers=2),
                 run_config=RunConfig(name="run", storage_path=sys.argv[2])).fit()
print(json.dumps({"error": repr(result.error), "ray_after_fit": ray.is_initialized()}))
"""


@pytest.mark.slow
def test_without_ray_the_driver_starts_one_on_loopback_for_the_data_and_stops_it(
    tmp_path: Path, scratch: str
) -> None:
    script = tmp_path / "driver.py"
    script.write_text(STARTS_ITS_OWN_RAY)
    env = dict(os.environ)
    # Not the tests' switch that puts every Ray node on 127.0.0.1: Cairn's own start must.
    env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(dataset_workloads.__file__).parent),
                                         env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, str(script), scratch, str(tmp_path / "storage")],
                          capture_output=True, text=True, env=env, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary == {"error": "None", "ray_after_fit": False}
    shards = [_read(scratch, 0, rank) for rank in (0, 1)]
    assert sorted(shards[0]["ids"] + shards[1]["ids"]) == list(range(10))  # type: ignore[operator]
    # Both local workers streamed from the instance the driver started, on loopback.
    addresses = {shard["ray_address"] for shard in shards}
    assert len(addresses) == 1 and str(addresses.pop()).startswith("127.0.0.1:")


def test_a_worker_on_another_ray_instance_is_told_which_one_to_connect_to(
    ray_cluster: None
) -> None:
    from cairn._src.wire.datasets import _connect_ray

    own = ray.get_runtime_context().gcs_address
    _connect_ray(own)  # already connected there: nothing to do
    with pytest.raises(ConfigError, match=r"get_dataset_shard\(\): this worker is connected to "
                       rf"the Ray instance at {own}, but the datasets run on the driver's, at "
                       r"127.0.0.1:1\. Call get_dataset_shard\(\) before anything in the train "
                       r"function starts Ray"):
        _connect_ray("127.0.0.1:1")
