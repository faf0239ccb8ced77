"""What the Ray backend hands each rank's actor as it starts it: local rank, GPUs, and
whether it watches its node's drain. Placement, the actors and their exit watchers are
stood in for: no Ray cluster.

Local ranks must match the controller's placement (each rank's context), a replaced rank
included, and each node keeps exactly one drain watcher (the preemption notice): a node
whose watcher was replaced would otherwise never see its drain again."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("ray")

from cairn import ScalingConfig
from cairn._src.backends import ray as ray_backend
from cairn._src.backends import ray_worker
from cairn._src.controller.attempt import placement


class FakeActor:
    """Records the arguments of its ``run.remote``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.runs: list[tuple[Any, ...]] = []
        self.run = self

    def remote(self, *args: Any) -> str:
        self.runs.append(args)
        return f"ref-{self.name}"

    @property
    def env(self) -> dict[str, str]:
        return dict(self.runs[-1][1])

    @property
    def watches_drain(self) -> bool:
        return bool(self.runs[-1][3])


class FakeBootstrap:
    def body(self, rank: int) -> dict[str, Any]:
        return {"rank": rank}


class FakeGroup:
    def __init__(self, bundle_count: int) -> None:
        self.bundle_count = bundle_count


class Cluster:
    """The backend's view of the cluster: each new actor runs where (and with the GPUs)
    the test says, in the order the backend creates them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, scaling: ScalingConfig) -> None:
        self.backend = ray_backend.RayBackend(scaling, placement_timeout_s=5.0)
        # Where the next actors land: (node id, GPU ids), one per actor.
        self.lands: list[tuple[str, tuple[str, ...]]] = []
        self.actors: list[FakeActor] = []
        monkeypatch.setattr(ray_worker, "_RefWatcher", lambda ref, name, node_id: None)
        monkeypatch.setattr(self.backend, "_ensure_ray", lambda: None)
        monkeypatch.setattr(self.backend, "_place", self._place)
        monkeypatch.setattr(self.backend, "_new_actor",
                            lambda group, bundle, index: self._actor(index))
        monkeypatch.setattr(self.backend, "_describe", self._describe)

    def _place(self, bundle: dict[str, float], num_workers: int, timeout_s: float,
               bounds: tuple[int, int] | None = None) -> FakeGroup:
        group = FakeGroup(num_workers)
        self.backend._group = group  # type: ignore[assignment]
        return group

    def _actor(self, index: int) -> FakeActor:
        actor = FakeActor(f"{index}.{len(self.actors)}")
        self.actors.append(actor)
        return actor

    def _describe(self, actors: list[Any],
                  timeout_s: float) -> list[tuple[int, int, str, tuple[str, ...]]]:
        landed, self.lands = self.lands[:len(actors)], self.lands[len(actors):]
        return [(index, 1000 + index, node, gpus)
                for index, (node, gpus) in enumerate(landed)]

    def start(self, lands: list[tuple[str, tuple[str, ...]]]) -> list[FakeActor]:
        self.lands = list(lands)
        self.backend.start(len(lands), FakeBootstrap())  # type: ignore[arg-type]
        return [worker.actor for worker in self.backend.workers]

    def replace(self, ranks: list[int],
                lands: list[tuple[str, tuple[str, ...]]]) -> list[FakeActor]:
        self.lands = list(lands)
        self.backend.replace(ranks, FakeBootstrap())  # type: ignore[arg-type]
        return [self.backend.workers[rank].actor for rank in ranks]

    def check_against_the_controllers_placement(self, ranks: list[int]) -> None:
        """The CAIRN_LOCAL_RANK/CAIRN_LOCAL_WORLD_SIZE of ``ranks`` (started last) are
        what their contexts say. A kept rank's stay as they were when it started (its
        context has the new ones, where another rank landed beside it)."""
        expected = placement(self.backend.workers)  # type: ignore[arg-type]
        for worker in self.backend.workers:
            if worker.rank not in ranks:
                continue
            env = worker.actor.env
            assert (int(env["CAIRN_LOCAL_RANK"]), int(env["CAIRN_LOCAL_WORLD_SIZE"])) == \
                expected[worker.rank][:2], worker.rank

    def watchers(self) -> dict[str, list[int]]:
        """node id -> the ranks whose actor watches its drain."""
        found: dict[str, list[int]] = {}
        for worker in self.backend.workers:
            if worker.actor.watches_drain:
                found.setdefault(worker.node_id, []).append(worker.rank)
        return found


TWO_NODES = [("A", ("0",)), ("A", ("1",)), ("B", ("0",)), ("B", ("1",))]


def test_the_replacement_of_a_nodes_local_rank_zero_is_local_rank_zero_and_watches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = Cluster(monkeypatch, ScalingConfig(num_workers=4, backend="ray"))
    actors = cluster.start(TWO_NODES)
    assert [a.env["CAIRN_LOCAL_RANK"] for a in actors] == ["0", "1", "0", "1"]
    cluster.check_against_the_controllers_placement([0, 1, 2, 3])
    assert cluster.watchers() == {"A": [0], "B": [2]}
    # Rank 0 (node A's local rank 0, its drain watcher) fails alone; rank 1 is kept.
    (new,) = cluster.replace([0], [("A", ("0",))])
    assert (new.env["CAIRN_LOCAL_RANK"], new.env["CAIRN_LOCAL_WORLD_SIZE"]) == ("0", "2")
    assert new.env["CAIRN_RANK"] == "0"
    assert new.watches_drain
    assert cluster.watchers() == {"A": [0], "B": [2]}
    cluster.check_against_the_controllers_placement([0])
    # Rank 3 (not a watcher) fails alone: local rank 1 again, node B keeps rank 2's watch.
    (new,) = cluster.replace([3], [("B", ("1",))])
    assert (new.env["CAIRN_LOCAL_RANK"], new.env["CAIRN_LOCAL_WORLD_SIZE"]) == ("1", "2")
    assert not new.watches_drain
    assert cluster.watchers() == {"A": [0], "B": [2]}
    cluster.check_against_the_controllers_placement([3])


def test_ranks_of_a_lost_node_get_one_watcher_wherever_they_land(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = Cluster(monkeypatch, ScalingConfig(num_workers=4, backend="ray"))
    cluster.start(TWO_NODES)
    # Node A is lost: its ranks land on a new node C, which the first of them watches.
    cluster.replace([0, 1], [("C", ()), ("C", ())])
    assert cluster.watchers() == {"C": [0], "B": [2]}
    cluster.check_against_the_controllers_placement([0, 1])
    # Node C is lost too; its ranks land beside the kept ranks of B, which still has one
    # watcher (rank 2), although rank 0 is now local rank 0 there.
    new = cluster.replace([0, 1], [("B", ()), ("B", ())])
    assert [a.env["CAIRN_LOCAL_RANK"] for a in new] == ["0", "1"]
    assert [a.env["CAIRN_LOCAL_WORLD_SIZE"] for a in new] == ["4", "4"]
    assert cluster.watchers() == {"B": [2]}
    cluster.check_against_the_controllers_placement([0, 1])


def test_each_gpu_worker_sees_its_nodes_gpus_and_knows_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = Cluster(monkeypatch, ScalingConfig(num_workers=4, backend="ray", use_gpu=True))
    # Ray gives a node's GPUs to its bundles in any order (and ids by number: 10 after 2).
    actors = cluster.start([("A", ("10",)), ("A", ("2",)), ("B", ("1",)), ("B", ("0",))])
    assert [(a.env["CUDA_VISIBLE_DEVICES"], a.env["CAIRN_GPU_IDS"]) for a in actors] == [
        ("2,10", "10"), ("2,10", "2"), ("0,1", "1"), ("0,1", "0")]
    # A replaced rank sees its node's GPUs too, the kept ranks' included.
    (new,) = cluster.replace([1], [("A", ("2",))])
    assert (new.env["CUDA_VISIBLE_DEVICES"], new.env["CAIRN_GPU_IDS"]) == ("2,10", "2")


def test_workers_with_half_a_gpu_share_its_id(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = Cluster(monkeypatch, ScalingConfig(num_workers=2, backend="ray", use_gpu=True,
                                                 resources_per_worker={"CPU": 1, "GPU": 0.5}))
    actors = cluster.start([("A", ("0",)), ("A", ("0",))])
    assert [(a.env["CUDA_VISIBLE_DEVICES"], a.env["CAIRN_GPU_IDS"]) for a in actors] == [
        ("0", "0"), ("0", "0")]


def test_workers_without_gpus_get_no_gpu_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = Cluster(monkeypatch, ScalingConfig(num_workers=2, backend="ray"))
    for actor in cluster.start([("A", ()), ("A", ())]):
        assert "CUDA_VISIBLE_DEVICES" not in actor.env
        assert "CAIRN_GPU_IDS" not in actor.env
