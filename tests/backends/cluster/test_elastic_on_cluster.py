"""An elastic range on the 3-node Ray cluster: fewer workers after a lost node, and back.

``ScalingConfig(num_workers=(2, 3))`` starts 3 workers; when a node is removed, the
restart places the 2 that fit, with world size 2, from the latest committed checkpoint;
once the node is back, the next restart places 3 again. ``(3, 3)`` instead waits for the
capacity to return. The size chosen at each start is logged with its reason, and Ray Data
shards are cut for the world of each attempt.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import ray
from invariants import check_run, run_dir
from ray.util.placement_group import placement_group, remove_placement_group

import cairn
from cairn import FailureConfig, ScalingConfig, Trainer
from cairn._src.backends.ray import PLACEMENT_TIMEOUT_ENV
from cairn._src.backends.ray_resources import count_fitting

from . import cluster_workloads, elastic_workloads
from .conftest import RayCluster

RunConfigFactory = Callable[..., cairn.RunConfig]
HOLD_AT = 1


class _BackendLog(logging.Handler):
    """The Ray backend's log lines, and an event per kind the tests wait on."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.sizes: list[str] = []
        self.waiting = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Placing "):
            self.sizes.append(message)
        elif message.startswith("Waiting for the Ray cluster to place"):
            self.waiting.set()


@pytest.fixture
def backend_log() -> Iterator[_BackendLog]:
    handler = _BackendLog()
    backend_logger = logging.getLogger("cairn._src.backends.ray")
    level = backend_logger.level
    backend_logger.setLevel(logging.INFO)
    backend_logger.addHandler(handler)
    yield handler
    backend_logger.removeHandler(handler)
    backend_logger.setLevel(level)


def wait_for_files(paths: list[str], stop: threading.Event, timeout: float = 240.0) -> bool:
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(p) for p in paths):
        if stop.is_set() or time.monotonic() > deadline:
            return False
        stop.wait(0.01)
    return True


def facts(scratch: str, attempt: int) -> dict[int, dict[str, Any]]:
    found = {}
    for name in os.listdir(scratch):
        match = re.fullmatch(rf"facts_{attempt}_(\d+)", name)
        if match:
            found[int(match.group(1))] = json.load(open(os.path.join(scratch, name)))
    return found


class _Driver:
    """``fit()`` on a thread: Ray adds nodes only from the main thread, the test's."""

    def __init__(self, trainer: Trainer) -> None:
        self.outcome: dict[str, Any] = {}
        self.ended = threading.Event()
        self._thread = threading.Thread(target=self._fit, args=(trainer,), name="driver",
                                        daemon=True)
        self._thread.start()

    def _fit(self, trainer: Trainer) -> None:
        try:
            self.outcome["result"] = trainer.fit()
        except BaseException as exc:
            self.outcome["error"] = exc
        finally:
            self.ended.set()

    def result(self) -> cairn.Result:
        self._thread.join(300)
        assert not self._thread.is_alive() and "error" not in self.outcome, (
            self.outcome.get("error"))
        result: cairn.Result = self.outcome["result"]
        return result


def remove_a_worker_node(cluster: RayCluster, scratch: str, attempt: int) -> str:
    """Remove the node of the last rank not on the head; its node id."""
    nodes = {rank: fact["node_id"] for rank, fact in facts(scratch, attempt).items()}
    head = cluster.cluster.head_node.node_id
    lost = next(nodes[r] for r in sorted(nodes, reverse=True) if nodes[r] != head)
    cluster.cluster.remove_node(cluster.worker_node(lost))
    return lost


@pytest.mark.slow
def test_a_range_continues_with_the_workers_that_fit_and_grows_back(
    cluster: RayCluster, run_config: RunConfigFactory, scratch: str,
    backend_log: _BackendLog,
) -> None:
    config = run_config(failure_config=FailureConfig(max_failures=2))
    # Attempt 0 holds after step 1, attempt 1 (2 workers) after step 3.
    job = {"steps": 6, "hold": {"0": HOLD_AT, "1": HOLD_AT + 2}, "scratch": scratch}
    driver = _Driver(Trainer(elastic_workloads.hold_in_attempts, train_loop_config=job,
                             scaling_config=ScalingConfig(num_workers=(2, 3), backend="ray"),
                             run_config=config))
    assert wait_for_files([os.path.join(scratch, f"holding_0_{r}") for r in range(3)],
                          driver.ended), driver.outcome.get("error")
    lost = remove_a_worker_node(cluster, scratch, 0)

    # The restart places the 2 workers the two nodes left can hold; it does not wait.
    assert wait_for_files([os.path.join(scratch, f"holding_1_{r}") for r in range(2)],
                          driver.ended), driver.outcome.get("error")
    smaller = facts(scratch, 1)
    assert sorted(smaller) == [0, 1]
    for fact in smaller.values():
        assert fact["world_size"] == 2
        assert fact["resumed"] == HOLD_AT + 1  # from the latest committed checkpoint
        assert fact["node_id"] != lost
    assert not backend_log.waiting.is_set()

    # Capacity returns; the next restart (a worker killed) grows back to 3.
    cluster.add_node()
    os.kill(smaller[1]["pid"], signal.SIGKILL)
    result = driver.result()
    grown = facts(scratch, 2)
    assert sorted(grown) == [0, 1, 2]
    for fact in grown.values():
        assert fact["world_size"] == 3
        assert fact["resumed"] == HOLD_AT + 3

    check_run(run_dir(config), scratch)
    assert result.goodput.attempts == 3 and result.goodput.failures == 2
    assert result.metrics == {"step": 5, "world_size": 3}
    history = result.metrics_dataframe
    assert list(zip(history["step"], history["world_size"], strict=True)) == [
        (0, 3), (1, 3), (2, 2), (3, 2), (4, 3), (5, 3)]
    # One line per start: the size chosen and why.
    assert len(backend_log.sizes) == 3, backend_log.sizes
    assert backend_log.sizes[0] == "Placing 3 of 2..3 workers: the cluster has room for all 3"
    assert backend_log.sizes[1].startswith("Placing 2 of 2..3 workers: the cluster "), (
        backend_log.sizes[1])
    assert backend_log.sizes[2].startswith("Placing 3 of 2..3 workers: "), backend_log.sizes[2]
    # The checkpoints each world wrote hold the files of its ranks.
    by_step = {json.load(open(os.path.join(c.path, "rank_0.json")))["step"]: c
               for c, _ in result.best_checkpoints}
    assert sorted(by_step[HOLD_AT + 2].get_manifest().files) == ["rank_0.json", "rank_1.json"]
    assert sorted(by_step[5].get_manifest().files) == [
        "rank_0.json", "rank_1.json", "rank_2.json"]


@pytest.mark.slow
def test_a_range_whose_minimum_does_not_fit_waits_for_capacity(
    cluster: RayCluster, run_config: RunConfigFactory, scratch: str,
    backend_log: _BackendLog,
) -> None:
    config = run_config(failure_config=FailureConfig(max_failures=1))
    job = {"steps": 4, "hold": {"0": HOLD_AT}, "scratch": scratch}
    driver = _Driver(Trainer(elastic_workloads.hold_in_attempts, train_loop_config=job,
                             scaling_config=ScalingConfig(num_workers=(3, 3), backend="ray"),
                             run_config=config))
    assert wait_for_files([os.path.join(scratch, f"holding_0_{r}") for r in range(3)],
                          driver.ended), driver.outcome.get("error")
    remove_a_worker_node(cluster, scratch, 0)
    # Two nodes cannot hold 3 workers: the restart waits, and capacity returns.
    assert backend_log.waiting.wait(240), driver.outcome.get("error")
    cluster.add_node()
    result = driver.result()
    again = facts(scratch, 1)
    assert sorted(again) == [0, 1, 2]
    for fact in again.values():
        assert fact["world_size"] == 3 and fact["resumed"] == HOLD_AT + 1
    check_run(run_dir(config), scratch)
    assert result.metrics == {"step": 3, "world_size": 3}


@pytest.mark.slow
def test_a_size_held_up_by_resources_in_use_falls_back_to_what_is_free(
    cluster: RayCluster, run_config: RunConfigFactory, scratch: str,
    backend_log: _BackendLog,
) -> None:
    # Another job holds one of the three CPUs: the nodes' totals allow 3, 2 are free.
    other = placement_group([{"CPU": 1}])
    assert other.wait(120)
    try:
        result = Trainer(cluster_workloads.placement_facts,
                         train_loop_config={"scratch": scratch},
                         scaling_config=ScalingConfig(num_workers=(1, 3), backend="ray"),
                         run_config=run_config()).fit()
    finally:
        remove_placement_group(other)
    assert result.error is None
    sizes = {json.load(open(os.path.join(scratch, name)))["world_size"]
             for name in os.listdir(scratch) if name.startswith("placement_")}
    assert sizes == {2}
    assert sorted(os.listdir(scratch)) == ["placement_0", "placement_1"]
    assert backend_log.sizes == [
        "Placing 2 of 1..3 workers: the cluster did not place 3 within 5s (resources in "
        "use: room for 2 now)"]


@pytest.mark.slow
def test_a_minimum_that_never_fits_fails_with_the_shortfall_for_the_minimum(
    cluster: RayCluster, run_config: RunConfigFactory, monkeypatch: pytest.MonkeyPatch,
    backend_log: _BackendLog,
) -> None:
    monkeypatch.setenv(PLACEMENT_TIMEOUT_ENV, "1")
    with pytest.raises(cairn.PlacementTimeoutError,
                       match=r"could not place 4 workers \(CPU 1 each, strategy PACK, the "
                             r"fewest of num_workers=\(4, 5\)\) within 1s: the workers need "
                             r"CPU 4 in all, the cluster has CPU 3\. The cluster has 3 alive "
                             r"nodes with CPU 3\. Add nodes with these resources, lower "
                             r"ScalingConfig\.num_workers \(its minimum\) or "
                             r"resources_per_worker, or wait longer with "
                             rf"{PLACEMENT_TIMEOUT_ENV}=<seconds>\."):
        Trainer(cluster_workloads.placement_facts, train_loop_config={"scratch": "-"},
                scaling_config=ScalingConfig(num_workers=(4, 5), backend="ray"),
                run_config=run_config()).fit()
    assert backend_log.sizes == [
        "Placing 4 of 4..5 workers: the cluster has room for 3, fewer than min_workers: "
        "waiting up to 1s for capacity"]


@pytest.mark.slow
def test_ray_data_shards_follow_the_world_size_of_each_attempt(
    cluster: RayCluster, run_config: RunConfigFactory, scratch: str,
) -> None:
    # Another job holds a CPU: attempt 0 gets 2 workers; it lets go, a worker is killed,
    # and attempt 1 gets 3.
    other = placement_group([{"CPU": 1}])
    assert other.wait(120)
    job = {"steps": 3, "hold": {"0": HOLD_AT}, "scratch": scratch, "dataset": True}
    try:
        driver = _Driver(Trainer(
            elastic_workloads.hold_in_attempts, train_loop_config=job,
            datasets={"train": ray.data.from_items([{"id": i} for i in range(24)])},
            scaling_config=ScalingConfig(num_workers=(2, 3), backend="ray"),
            run_config=run_config(failure_config=FailureConfig(max_failures=1))))
        assert wait_for_files([os.path.join(scratch, f"holding_0_{r}") for r in range(2)],
                              driver.ended), driver.outcome.get("error")
    finally:
        remove_placement_group(other)
    os.kill(facts(scratch, 0)[1]["pid"], signal.SIGKILL)
    result = driver.result()
    assert result.metrics == {"step": 2, "world_size": 3}
    for attempt, world in ((0, 2), (1, 3)):
        shards = [json.load(open(os.path.join(scratch, f"shard_{attempt}_{rank}")))
                  for rank in range(world)]
        assert [len(shard) for shard in shards] == [24 // world] * world
        assert sorted(i for shard in shards for i in shard) == list(range(24))


def _node(resources: dict[str, float], alive: bool = True) -> dict[str, Any]:
    return {"Alive": alive, "Resources": resources}


@pytest.mark.parametrize(("bundle", "strategy", "available", "expected"), [
    ({"CPU": 1}, "PACK", None, 5),           # 2 + 1 + 2, the dead node not counted
    ({"CPU": 1}, "SPREAD", {"CPU": 3.0}, 3),  # what is free now caps it
    ({"CPU": 1, "GPU": 1}, "PACK", None, 1),  # one node has a GPU
    ({"CPU": 2}, "STRICT_PACK", None, 1),    # one node, the largest
    ({"CPU": 1}, "STRICT_SPREAD", None, 3),  # one per alive node
    ({"CPU": 0.5}, "PACK", None, 11),        # 4 + 2 + 5: halves of 2.5 CPUs too
    ({"tpu": 1}, "PACK", None, 0),
])
def test_count_fitting_counts_whole_bundles_on_alive_nodes(
    bundle: dict[str, float], strategy: str, available: dict[str, float] | None,
    expected: int,
) -> None:
    nodes = [_node({"CPU": 2.0, "memory": 1e9}), _node({"CPU": 1.0, "GPU": 1.0}),
             _node({"CPU": 2.5}), _node({"CPU": 8.0}, alive=False)]
    assert count_fitting(bundle, strategy, nodes, available) == expected
