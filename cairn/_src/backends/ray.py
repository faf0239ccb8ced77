"""The Ray backend: workers are actors on a Ray cluster, placed by a placement group.

Each actor runs the same worker runtime as a local worker process and connects back to
the controller over TCP with the run's secret. An actor's death (a crash, ``ray.kill``,
a lost node, the memory monitor) surfaces as the failure of its ``run`` task, which a
thread per worker waits on and turns into a readable pipe for the controller: no polling.

Waits on the cluster are bounded: the placement group must be ready, and the actors
started, within ``CAIRN_RAY_PLACEMENT_TIMEOUT_S`` seconds each (default
:data:`DEFAULT_PLACEMENT_TIMEOUT_S`, read at each start of the group); past that,
:class:`PlacementTimeoutError` names the resources the cluster lacks and ends ``fit()``
(the run stays resumable: ``fit()`` again continues it). After a lost node the next
attempt waits there for capacity to return (a replaced node, an autoscaler), then resumes
from the latest committed checkpoint.

An elastic range (``ScalingConfig(num_workers=(min, max))``) starts as many workers as the
cluster can place now, within the bounds, at each start of the group: the largest size
the alive nodes' total resources allow (:func:`count_fitting`) is tried first, each size
above ``min_workers`` for a short probe (:data:`_PROBE_S`, as the resources in use may
hold the rest), and ``min_workers`` with the bounded wait above. A smaller group after a
lost node grows back to ``max_workers`` at a later restart once capacity has returned.

Ranks follow the placement: ranks on one node are contiguous (nodes in the order of their
first bundle), so node rank, local rank and local world size describe the real machines.
Ray makes only an actor's own GPUs visible to it; as Ray Train does, each worker of a node
sees the GPUs of all the node's workers instead and trains on its own (:func:`gpu_env`).

The driver's ``sys.path`` travels to the actor, which puts it first on its own (and in
``PYTHONPATH`` for its subprocesses) so that a train function pickled by reference
imports, as with the local backend; on a multi-node cluster ship the code with Ray's
``runtime_env`` (``ray.init(runtime_env={"working_dir": ...})``). Cairn's variables are
set by the actor too: an actor without a runtime environment can run in a worker process
Ray prestarted. ``FailureConfig(warm_standby=True)`` keeps spare actors booted while an
attempt trains, for the next attempt (:mod:`ray_standby`).

``FailureConfig(keep_survivors=True)``: :meth:`RayBackend.kill_ranks` and
:meth:`RayBackend.replace` replace the actors of the failed ranks only, each in its own
bundle of the placement group (which Ray places again when its node was lost), and keep
the others' actors running.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Collection, Iterable
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from cairn._src.backends.protocol import WorkerHandle
from cairn._src.backends.ray_resources import (
    count_fitting,
    describe_shortfall,
    format_resources,
    gpu_env,
    gpus_by_node,
    local_placement,
    worker_bundle,
)
from cairn._src.backends.ray_standby import RayStandby
from cairn._src.backends.ray_worker import RayWorker, WorkerActor
from cairn._src.config.run import ScalingConfig
from cairn._src.errors import ConfigError, PlacementTimeoutError
from cairn._src.wire.bootstrap import Bootstrap

logger = logging.getLogger(__name__)

PLACEMENT_TIMEOUT_ENV = "CAIRN_RAY_PLACEMENT_TIMEOUT_S"
# Long enough for a replaced node or an autoscaler's new one; a request no node can ever
# satisfy is logged after _PLACEMENT_NOTICE_S so nobody waits in silence.
DEFAULT_PLACEMENT_TIMEOUT_S = 120.0
_PLACEMENT_NOTICE_S = 5.0
# How long an elastic start waits for a size above min_workers that the nodes' totals
# allow: a free cluster places a group in well under a second, so a size not placed by
# then is held up by resources in use (another job, this run's previous group still
# being released), and the next smaller size is tried.
_PROBE_S = 5.0


def read_placement_timeout() -> float:
    """Seconds to wait for a placement group, and for its actors to start."""
    raw = os.environ.get(PLACEMENT_TIMEOUT_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_PLACEMENT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{PLACEMENT_TIMEOUT_ENV}={raw!r} must be a number of seconds > 0 "
                          f"(default {DEFAULT_PLACEMENT_TIMEOUT_S:g}).")
    return value


class RayBackend:
    """Starts workers as Ray actors; connects to a running cluster or starts a local one."""

    name = "ray"
    bind_host = "0.0.0.0"

    def __init__(self, scaling: ScalingConfig, *, env: dict[str, str] | None = None,
                 placement_timeout_s: float | None = None, warm_standby: bool = False) -> None:
        self._scaling = scaling
        self._env = env or {}
        # The environment is read at each start of the group (a restart may need to wait
        # longer than the first start) and checked now, so a bad value fails fit() first.
        self._placement_timeout_s = placement_timeout_s
        if placement_timeout_s is None:
            read_placement_timeout()
        self.workers: list[RayWorker] = []
        # Each rank's bundle in the placement group (a replaced rank runs in its own).
        self._bundle_of: dict[int, int] = {}
        self._group: PlacementGroup | None = None
        # FailureConfig(warm_standby=True): spare actors, and what the last start asked for
        # (the bundle, the modules to preload, the group's size) to prepare them.
        self._standby = RayStandby(WorkerActor) if warm_standby else None
        self._last_start: tuple[dict[str, float], list[str], int] | None = None

    def advertise_host(self) -> str:
        self._ensure_ray()
        return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]

    @staticmethod
    def _ensure_ray() -> None:
        if not ray.is_initialized():
            # RAY_ADDRESS (or a running local cluster) is used when set; otherwise Ray
            # starts a cluster on this machine.
            ray.init(log_to_driver=True)

    def _bundle(self) -> dict[str, float]:
        return worker_bundle(self._scaling)

    def _describe_request(self, bundle: dict[str, float], num_workers: int,
                          bounds: tuple[int, int] | None = None) -> str:
        fewest = (f", the fewest of num_workers=({bounds[0]}, {bounds[1]})"
                  if bounds is not None and bounds[0] < bounds[1] else "")
        return (f"{num_workers} {'worker' if num_workers == 1 else 'workers'} "
                f"({format_resources(bundle)} each, strategy "
                f"{self._scaling.placement_strategy}{fewest})")

    def _try_place(self, bundle: dict[str, float], num_workers: int,
                   timeout_s: float) -> PlacementGroup | None:
        """A group of ``num_workers`` bundles if the cluster places it within
        ``timeout_s``, else None (and no group left behind)."""
        group: PlacementGroup = placement_group([bundle] * num_workers,
                                                strategy=self._scaling.placement_strategy)
        self._group = group
        done, _ = ray.wait([group.ready()], timeout=timeout_s)
        if done:
            return group
        self._remove_group()
        return None

    def _place_elastic(self, bundle: dict[str, float], bounds: tuple[int, int],
                       timeout_s: float) -> PlacementGroup:
        """The largest group within ``bounds`` that the cluster places now, or one of
        ``bounds[0]`` after the bounded wait; logs the size chosen and why."""
        low, high = bounds
        strategy = self._scaling.placement_strategy
        nodes = ray.nodes()  # type: ignore[no-untyped-call]
        room = count_fitting(bundle, strategy, nodes)
        alive = sum(1 for n in nodes if n.get("Alive"))
        why = (f"the cluster has room for {room} ({alive} alive "
               f"{'node' if alive == 1 else 'nodes'})" if room < high else
               f"the cluster has room for all {high}")
        size = max(low, min(high, room))
        probe_s = min(_PROBE_S, timeout_s)
        while size > low:
            group = self._try_place(bundle, size, probe_s)
            if group is not None:
                self._log_size(size, bounds, why)
                return group
            # What is free now (the previous group has been released by then) may rule
            # out more than one size at once.
            free = count_fitting(
                bundle, strategy, ray.nodes(),  # type: ignore[no-untyped-call]
                ray.available_resources())  # type: ignore[no-untyped-call]
            why = (f"the cluster did not place {size} within {probe_s:g}s (resources in "
                   f"use: room for {min(free, size - 1)} now)")
            size = max(low, min(size - 1, free))
        if room < low:
            why = (f"the cluster has room for {room}, fewer than min_workers: waiting up to "
                   f"{timeout_s:g}s for capacity")
        self._log_size(low, bounds, why)
        return self._place(bundle, low, timeout_s, bounds)

    @staticmethod
    def _log_size(size: int, bounds: tuple[int, int], why: str) -> None:
        logger.info("Placing %d of %d..%d workers: %s", size, bounds[0], bounds[1], why)

    def _place(self, bundle: dict[str, float], num_workers: int, timeout_s: float,
               bounds: tuple[int, int] | None = None) -> PlacementGroup:
        group: PlacementGroup = placement_group([bundle] * num_workers,
                                                strategy=self._scaling.placement_strategy)
        self._group = group
        ready = group.ready()
        request = self._describe_request(bundle, num_workers, bounds)
        started = time.monotonic()
        notice_s = min(_PLACEMENT_NOTICE_S, timeout_s)
        done, _ = ray.wait([ready], timeout=notice_s)
        if not done and timeout_s > notice_s:
            logger.warning("Waiting for the Ray cluster to place %s, up to %gs (%s): %s",
                           request, timeout_s, PLACEMENT_TIMEOUT_ENV, self._shortfall(
                               bundle, num_workers))
            done, _ = ray.wait([ready], timeout=max(0.0, timeout_s - notice_s))
            if done:
                logger.info("The Ray cluster placed %s after %.1fs", request,
                            time.monotonic() - started)
        if not done:
            shortfall = self._shortfall(bundle, num_workers)
            self._remove_group()
            raise PlacementTimeoutError(
                f"The Ray cluster could not place {request} within {timeout_s:g}s: "
                f"{shortfall}. Add nodes with these resources, lower "
                f"ScalingConfig.num_workers{' (its minimum)' if bounds else ''} or "
                "resources_per_worker, or wait longer with "
                f"{PLACEMENT_TIMEOUT_ENV}=<seconds>.")
        return group

    def _shortfall(self, bundle: dict[str, float], num_workers: int) -> str:
        return describe_shortfall(
            bundle, num_workers, self._scaling.placement_strategy,
            ray.nodes(), ray.available_resources())  # type: ignore[no-untyped-call]

    def start(self, num_workers: int, bootstrap: Bootstrap, *,
              env: dict[str, str] | None = None) -> list[WorkerHandle]:
        timeout_s = (read_placement_timeout() if self._placement_timeout_s is None
                     else self._placement_timeout_s)
        self._ensure_ray()
        started = time.monotonic()
        bundle = self._bundle()
        low = min(self._scaling.min_workers, num_workers)
        if low < num_workers:
            group = self._place_elastic(bundle, (low, num_workers), timeout_s)
            num_workers = group.bundle_count
        else:
            group = self._place(bundle, num_workers, timeout_s)
        logger.debug("Ray placement group of %d bundles ready in %.2fs", num_workers,
                     time.monotonic() - started)
        path = [p for p in sys.path if p]
        base_env = self._base_env(num_workers, env, path)
        spares = self._spares_for(group, bundle, range(num_workers))
        preload = [m for m in base_env.get("CAIRN_PRELOAD", "").split(",") if m.strip()]
        self._last_start = (bundle, preload, num_workers)
        actors = [spares[index] or self._new_actor(group, bundle, index)
                  for index in range(num_workers)]
        described = self._describe(actors, timeout_s)
        logger.debug("%d Ray worker actors started in %.2fs", num_workers,
                     time.monotonic() - started)
        # Ranks on one node are contiguous, nodes in the order of their first bundle.
        node_order: dict[str, int] = {}
        for _, _, node_id, _ in described:
            node_order.setdefault(node_id, len(node_order))
        placed = sorted(zip(actors, described, strict=True),
                        key=lambda item: (node_order[item[1][2]], item[1][0]))
        local = local_placement({rank: d[2] for rank, (_, d) in enumerate(placed)})
        node_gpus = gpus_by_node((d[2], d[3]) for _, d in placed)
        self.workers = []
        self._bundle_of = {}
        for rank, (actor, (index, pid, node_id, gpus)) in enumerate(placed):
            self._bundle_of[rank] = index
            # Local rank 0 of each node watches its drain (the preemption notice).
            self.workers.append(self._run(
                actor, rank, pid, node_id, bootstrap, path,
                {**base_env, **self._rank_env(local[rank], gpus, node_gpus[node_id])},
                gpu_ids=gpus, watches_drain=local[rank][0] == 0))
        logger.info("Started %d Ray workers on %d nodes", num_workers, len(node_order))
        if any(spare is not None for spare in spares):
            # Spares used up: new ones boot now, while this attempt restores, ready for a
            # failure soon after it (a restart's first report may come too late for that).
            self.prepare_standby()
        return list(self.workers)

    def _base_env(self, num_workers: int, env: dict[str, str] | None,
                  path: list[str]) -> dict[str, str]:
        """The variables every rank's actor sets as its run starts.

        The actor sets them itself (with the per-rank ones, known then), in the driver's
        sys.path order. No runtime environment unless RunConfig.worker_env asks for
        variables set at the process's start: an actor with one never runs in a worker
        process Ray prestarted (Ray starts a fresh one through its runtime environment
        agent, seconds on a loaded node, at Ray's low worker priority), and the attempt's
        own variables (MASTER_PORT) would make each attempt's environment a new one."""
        given = {**self._env, **(env or {})}.get("PYTHONPATH")
        return {**self._env, **(env or {}), "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join(p for p in [given, *path] if p),
                "CAIRN_WORKER": "1", "CAIRN_WORLD_SIZE": str(num_workers)}

    def _new_actor(self, group: PlacementGroup, bundle: dict[str, float], index: int) -> Any:
        """A fresh worker actor in bundle ``index`` of ``group``."""
        options: dict[str, Any] = {
            "num_cpus": bundle.get("CPU", 0.0),
            "num_gpus": bundle.get("GPU", 0.0),
            "resources": {k: v for k, v in bundle.items() if k not in ("CPU", "GPU")},
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=group, placement_group_bundle_index=index),
            "max_restarts": 0,
        }
        if self._env:
            options["runtime_env"] = {"env_vars": dict(self._env)}
        return WorkerActor.options(**options).remote()  # type: ignore[attr-defined]

    @staticmethod
    def _rank_env(local: tuple[int, int], gpu_ids: tuple[str, ...],
                  node_gpu_ids: list[str]) -> dict[str, str]:
        """A rank's own variables: its ``(local rank, local world size)`` as the
        controller's placement numbers them, and its GPUs (:func:`gpu_env`)."""
        return {"CAIRN_LOCAL_RANK": str(local[0]), "CAIRN_LOCAL_WORLD_SIZE": str(local[1]),
                **gpu_env(gpu_ids, node_gpu_ids)}

    @staticmethod
    def _run(actor: Any, rank: int, pid: int, node_id: str, bootstrap: Bootstrap,
             path: list[str], env: dict[str, str], *, gpu_ids: tuple[str, ...],
             watches_drain: bool) -> RayWorker:
        """Start rank ``rank``'s run in ``actor``; its handle."""
        ref = actor.run.remote(bootstrap.body(rank), {**env, "CAIRN_RANK": str(rank)}, path,
                               watches_drain)
        return RayWorker(rank, actor, ref, pid, node_id, gpu_ids=gpu_ids,
                         watches_drain=watches_drain)

    def replace_refusal(self) -> str | None:
        """An elastic range restarts the whole group: a replaced rank's bundle whose node
        is gone waits for room there, where a new group can start smaller at once."""
        low, high = self._scaling.min_workers, self._scaling.max_workers
        if low < high:
            return (f"ScalingConfig(num_workers=({low}, {high})) is elastic: the whole group "
                    "restarts, so that it can start with fewer workers when a node is gone")
        return None

    def kill_ranks(self, ranks: Collection[int]) -> None:
        """Kill the actors of ``ranks`` (FailureConfig(keep_survivors=True): the other
        ranks' actors run the next attempt); their bundles stay in the placement group."""
        for worker in self.workers:
            if worker.rank in ranks:
                ray.kill(worker.actor, no_restart=True)
        for worker in self.workers:
            if worker.rank in ranks:
                worker.wait_exit(10.0)
                worker.exit_watcher.close()

    def replace(self, ranks: Collection[int], bootstrap: Bootstrap, *,
                env: dict[str, str] | None = None) -> list[WorkerHandle]:
        """A new actor for each of ``ranks`` (killed by :meth:`kill_ranks`), in that
        rank's bundle of the placement group, handed ``bootstrap``; the other ranks'
        actors stay. Every rank's handle.

        A bundle on a lost node is placed again by Ray where the cluster has room: the
        actor waits for that up to the placement timeout, as a start of the whole group
        does (:class:`PlacementTimeoutError` past it)."""
        group = self._group
        if group is None or not self.workers:
            raise RuntimeError("replace() needs a running group: start() it first")
        timeout_s = (read_placement_timeout() if self._placement_timeout_s is None
                     else self._placement_timeout_s)
        started = time.monotonic()
        bundle = self._bundle()
        path = [p for p in sys.path if p]
        base_env = self._base_env(len(self.workers), env, path)
        order = sorted(ranks)
        spares = self._spares_for(group, bundle, [self._bundle_of[r] for r in order])
        actors = [spare or self._new_actor(group, bundle, self._bundle_of[rank])
                  for rank, spare in zip(order, spares, strict=True)]
        described = self._describe(actors, timeout_s)
        # Local ranks as the controller numbers them for the attempt (in rank order on
        # each node, kept ranks included): a replaced local rank 0 is local rank 0 again.
        kept = [worker for worker in self.workers if worker.rank not in ranks]
        node_of = {worker.rank: worker.node_id for worker in kept}
        node_of.update((rank, d[2]) for rank, d in zip(order, described, strict=True))
        local = local_placement(node_of)
        node_gpus = gpus_by_node([(w.node_id, w.gpu_ids) for w in kept]
                                 + [(d[2], d[3]) for d in described])
        # One drain watcher per node: a kept one goes on watching; otherwise the lowest
        # replaced rank there watches (the replacement of the node's local rank 0, or the
        # first rank on a node the group did not use before).
        watched = {worker.node_id for worker in kept if worker.watches_drain}
        for rank, actor, (_, pid, node_id, gpus) in zip(order, actors, described, strict=True):
            watches = node_id not in watched
            watched.add(node_id)
            self.workers[rank] = self._run(
                actor, rank, pid, node_id, bootstrap, path,
                {**base_env, **self._rank_env(local[rank], gpus, node_gpus[node_id])},
                gpu_ids=gpus, watches_drain=watches)
        logger.info("Replaced the Ray workers of ranks %s in %.2fs (nodes %s); kept ranks %s",
                    order, time.monotonic() - started,
                    ", ".join(self.workers[r].node_id[:12] for r in order),
                    [w.rank for w in self.workers if w.rank not in ranks])
        return list(self.workers)

    def _spares_for(self, group: PlacementGroup, bundle: dict[str, float],
                    indices: Iterable[int]) -> list[Any | None]:
        """For each bundle of ``indices``, the warm standby actor on its node, if one is
        there."""
        wanted = list(indices)
        if self._standby is None or not RayStandby.applies(bundle):
            return [None] * len(wanted)
        try:
            table = ray.util.placement_group_table(group)
            alive = {str(n["NodeID"]) for n in ray.nodes()  # type: ignore[no-untyped-call]
                     if n.get("Alive")}
            # A bundle of a lost node may still name it until Ray places the bundle
            # again: no spare of that node (it is gone with it).
            nodes = {int(k): str(v) for k, v in table.get("bundles_to_node_id", {}).items()
                     if str(v) in alive}
        except Exception as exc:
            logger.debug("No bundle nodes for the placement group: %s", exc)
            return [None] * len(wanted)
        spares = [self._standby.take(nodes[i]) if i in nodes else None for i in wanted]
        if any(spare is not None for spare in spares):
            logger.info("Running %d of %d ranks in warm standby Ray actors",
                        sum(spare is not None for spare in spares), len(wanted))
        return spares

    def _describe(self, actors: list[Any],
                  timeout_s: float) -> list[tuple[int, int, str, tuple[str, ...]]]:
        """(bundle index, pid, node id, GPU ids) of each actor once it runs, in bundle
        order.

        An actor that died while starting (its node lost, a broken runtime environment)
        gets pid -1: its ``run`` task fails at once and the controller sees that rank's
        failure like any other. Actors not started within ``timeout_s`` fail the start.
        """
        refs = [actor.describe.remote() for actor in actors]
        _, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        if pending:
            missing = sorted(refs.index(ref) for ref in pending)
            for actor in actors:
                ray.kill(actor, no_restart=True)
            self._remove_group()
            raise PlacementTimeoutError(
                f"{len(missing)} of {len(actors)} Ray worker actors (placement bundles "
                f"{', '.join(map(str, missing))}) did not start within {timeout_s:g}s of "
                "their placement: their node may be overloaded or setting up the runtime "
                f"environment; wait longer with {PLACEMENT_TIMEOUT_ENV}=<seconds>.")
        described = []
        for index, ref in enumerate(refs):
            try:
                pid, node_id, gpus = ray.get(ref)
            except ray.exceptions.RayError as exc:
                logger.warning("Ray worker actor %d failed as it started: %s", index,
                               str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
                pid, node_id, gpus = -1, f"unknown-{index}", []
            described.append((index, pid, node_id, tuple(str(gpu) for gpu in gpus)))
        return described

    def _remove_group(self) -> None:
        if self._group is not None:
            try:
                remove_placement_group(self._group)
            except Exception as exc:
                logger.debug("Could not remove the placement group: %s", exc)
            self._group = None

    def shutdown(self, *, grace_s: float = 5.0) -> None:
        deadline = time.monotonic() + max(0.0, grace_s)
        for worker in self.workers:
            if not worker.wait_exit(max(0.0, deadline - time.monotonic())):
                ray.kill(worker.actor, no_restart=True)
        for worker in self.workers:
            ray.kill(worker.actor, no_restart=True)
            worker.wait_exit(10.0)
            worker.exit_watcher.close()
        self.workers = []
        self._remove_group()

    def kill(self) -> None:
        self.shutdown(grace_s=0.0)

    def prepare_standby(self) -> None:
        """With warm standby, start the spares for the next attempt (at this attempt's
        first report): one per rank on the group's nodes, and one on each other alive node
        that fits a worker, up to one more in all than the group has."""
        if self._standby is None or self._last_start is None:
            return
        bundle, preload, num_workers = self._last_start
        if not RayStandby.applies(bundle):
            return
        wanted: dict[str, int] = {}
        for worker in self.workers:
            if worker.pid >= 0:
                wanted[worker.node_id] = wanted.get(worker.node_id, 0) + 1
        try:
            others = [str(n["NodeID"]) for n in ray.nodes()  # type: ignore[no-untyped-call]
                      if n.get("Alive") and count_fitting(bundle, "PACK", [n]) > 0]
        except Exception as exc:
            logger.debug("Could not list the Ray nodes for warm standby: %s", exc)
            others = []
        for node_id in others:
            if sum(wanted.values()) > num_workers:
                break
            wanted.setdefault(node_id, 1)
        self._standby.prepare(wanted, {"env_vars": dict(self._env)} if self._env else None,
                              preload, [p for p in sys.path if p])

    def stop_standby(self) -> None:
        """The run is over: the spare actors go too."""
        if self._standby is not None:
            self._standby.stop()
