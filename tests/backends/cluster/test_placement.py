"""Where workers land on a 3-node Ray cluster, and bounded waits for resources."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable

import pytest
from ray.util.placement_group import placement_group, remove_placement_group

import cairn
from cairn import ScalingConfig, Trainer
from cairn._src.backends.ray import (
    PLACEMENT_TIMEOUT_ENV,
    PlacementTimeoutError,
    read_placement_timeout,
)
from cairn._src.backends.ray_resources import describe_shortfall

from . import cluster_workloads
from .conftest import RayCluster

RunConfigFactory = Callable[..., cairn.RunConfig]


def read_placement(scratch: str, workers: int) -> list[dict[str, object]]:
    return [json.load(open(os.path.join(scratch, f"placement_{rank}")))
            for rank in range(workers)]


@pytest.mark.slow
@pytest.mark.parametrize(("workers", "cpus", "strategy"), [(3, 1.0, "SPREAD"),
                                                           (4, 0.5, "PACK")])
def test_node_and_local_ranks_follow_the_real_placement(
    workers: int, cpus: float, strategy: str, cluster: RayCluster,
    run_config: RunConfigFactory, scratch: str,
) -> None:
    Trainer(cluster_workloads.placement_facts, train_loop_config={"scratch": scratch},
            scaling_config=ScalingConfig(num_workers=workers, backend="ray",
                                         resources_per_worker={"CPU": cpus},
                                         placement_strategy=strategy),
            run_config=run_config()).fit()
    facts = read_placement(scratch, workers)
    nodes = [str(f["node_id"]) for f in facts]
    # Ranks on one node are contiguous; nodes are numbered in the order of their ranks.
    order = list(dict.fromkeys(nodes))
    assert nodes == sorted(nodes, key=order.index)
    for rank, fact in enumerate(facts):
        on_node = [r for r, node in enumerate(nodes) if node == nodes[rank]]
        assert fact["world_size"] == workers
        assert fact["node_rank"] == order.index(nodes[rank])
        assert fact["local_rank"] == on_node.index(rank)
        assert fact["local_world_size"] == len(on_node)
        assert fact["env"] == [str(rank), str(fact["local_rank"]),
                               str(fact["local_world_size"])]
    if strategy == "SPREAD":
        # One CPU per node: three workers need all three nodes.
        assert len(order) == 3
    else:
        # Half a CPU each, packed: two nodes of two workers.
        assert len(order) >= 2 and max(f["local_world_size"] for f in facts) == 2


@pytest.mark.slow
@pytest.mark.parametrize(("workers", "resources", "message"), [
    (2, {"CPU": 1, "tpu_v9": 1},
     r"could not place 2 workers \(CPU 1, tpu_v9 1 each, strategy PACK\) within 1s: "
     r"no node has 'tpu_v9'\. The cluster has 3 alive nodes with CPU 3\. Add nodes"),
    (1, {"CPU": 2},
     r"could not place 1 worker \(CPU 2 each, strategy PACK\) within 1s: no node is large "
     r"enough for one worker\."),
    (4, {"CPU": 1},
     r"could not place 4 workers \(CPU 1 each, strategy PACK\) within 1s: the workers need "
     r"CPU 4 in all, the cluster has CPU 3\."),
])
def test_impossible_resources_fail_with_what_is_missing(
    workers: int, resources: dict[str, float], message: str, cluster: RayCluster,
    run_config: RunConfigFactory, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(PLACEMENT_TIMEOUT_ENV, "1")
    with pytest.raises(PlacementTimeoutError,
                       match=message + rf".*wait longer with {PLACEMENT_TIMEOUT_ENV}="):
        Trainer(cluster_workloads.placement_facts, train_loop_config={"scratch": "-"},
                scaling_config=ScalingConfig(num_workers=workers, backend="ray",
                                             resources_per_worker=resources),
                run_config=run_config()).fit()
    # The placement group was given back: the whole cluster can be placed again.
    whole = placement_group([{"CPU": 1}] * 3)
    try:
        assert whole.wait(120)
    finally:
        remove_placement_group(whole)


# --- the timeout setting and the message, without a cluster ------------------------------


def test_placement_timeout_has_a_default_and_reads_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(PLACEMENT_TIMEOUT_ENV, raising=False)
    assert read_placement_timeout() == 120.0
    monkeypatch.setenv(PLACEMENT_TIMEOUT_ENV, "2.5")
    assert read_placement_timeout() == 2.5


@pytest.mark.parametrize("value", ["soon", "0", "-3", "nan", "inf"])
def test_bad_placement_timeout_is_refused(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PLACEMENT_TIMEOUT_ENV, value)
    with pytest.raises(cairn.ConfigError,
                       match=rf"{PLACEMENT_TIMEOUT_ENV}='{value}' must be a number of seconds "
                             r"> 0 \(default 120\)"):
        read_placement_timeout()


def test_bad_placement_timeout_fails_fit_before_anything_starts(
    run_config: RunConfigFactory, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(PLACEMENT_TIMEOUT_ENV, "soon")
    with pytest.raises(cairn.ConfigError, match=rf"{PLACEMENT_TIMEOUT_ENV}='soon' must be"):
        Trainer(cluster_workloads.placement_facts, train_loop_config={"scratch": "-"},
                scaling_config=ScalingConfig(num_workers=2, backend="ray"),
                run_config=run_config()).fit()


def node(alive: bool = True, **resources: float) -> dict[str, object]:
    return {"Alive": alive, "Resources": {"memory": 1e9, "node:10.0.0.1": 1.0, **resources}}


def test_shortfall_of_a_strict_spread_and_of_resources_in_use() -> None:
    nodes = [node(CPU=4), node(CPU=4), node(alive=False, CPU=4)]
    assert describe_shortfall({"CPU": 1}, 3, "STRICT_SPREAD", nodes, {"CPU": 8}) == (
        "STRICT_SPREAD needs 3 nodes that fit a worker, the cluster has 2. "
        "The cluster has 2 alive nodes with CPU 8")
    assert describe_shortfall({"CPU": 4}, 2, "STRICT_PACK", nodes, {"CPU": 8}).startswith(
        "STRICT_PACK needs one node with CPU 8.")
    assert describe_shortfall({"CPU": 2}, 3, "PACK", nodes, {"CPU": 3}).startswith(
        "the resources exist but are in use: available now CPU 3 (other runs")


SITECUSTOMIZE = '''
import os, time
_release = os.environ.get("CAIRN_TEST_HOLD_START")
if _release:
    while not os.path.exists(_release):
        time.sleep(0.05)
'''


@pytest.mark.slow
def test_actors_that_do_not_start_fail_with_a_bounded_wait(
    cluster: RayCluster, run_config: RunConfigFactory, monkeypatch: pytest.MonkeyPatch,
    tmp_path: os.PathLike[str],
) -> None:
    # Every worker's interpreter hangs as it starts (a sitecustomize on the PYTHONPATH
    # that RunConfig.worker_env sets as the process starts) until the test releases it.
    hook = os.path.join(os.fspath(tmp_path), "hook")
    os.makedirs(hook)
    with open(os.path.join(hook, "sitecustomize.py"), "w") as f:
        f.write(SITECUSTOMIZE)
    release = os.path.join(os.fspath(tmp_path), "release")
    monkeypatch.syspath_prepend(hook)
    monkeypatch.setenv(PLACEMENT_TIMEOUT_ENV, "2")
    try:
        with pytest.raises(PlacementTimeoutError,
                           match=r"3 of 3 Ray worker actors \(placement bundles 0, 1, 2\) did "
                                 r"not start within 2s of their placement: .* wait longer "
                                 rf"with {PLACEMENT_TIMEOUT_ENV}=<seconds>\."):
            Trainer(cluster_workloads.placement_facts, train_loop_config={"scratch": "-"},
                    scaling_config=ScalingConfig(num_workers=3, backend="ray"),
                    run_config=run_config(worker_env={
                        "CAIRN_TEST_HOLD_START": release,
                        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})).fit()
    finally:
        open(release, "w").close()
    whole = placement_group([{"CPU": 1}] * 3)
    try:
        assert whole.wait(120)
    finally:
        remove_placement_group(whole)
