"""What a Ray worker asks for, and what a cluster can hold: pure logic on ``ray.nodes()``
and ``ray.available_resources()`` entries, for placement and its error messages."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cairn._src.config.run import ScalingConfig

# Resources every node advertises that a worker's bundle never asks for.
_BOOKKEEPING = ("memory", "object_store_memory")
# A Ray worker's own GPU ids (``ray.get_gpu_ids()``), comma-separated; the backend sets
# them with ``CUDA_VISIBLE_DEVICES``, which names every GPU of the node's workers, and the
# torch set-up trains on the device at the index of the first of them (:func:`gpu_env`).
GPU_IDS_ENV = "CAIRN_GPU_IDS"


def format_resources(resources: dict[str, float]) -> str:
    return ", ".join(f"{name} {value:g}" for name, value in sorted(resources.items())) or "none"


def describe_shortfall(bundle: dict[str, float], num_workers: int, strategy: str,
                       nodes: list[dict[str, Any]], available: dict[str, float]) -> str:
    """What the cluster lacks to place ``num_workers`` bundles: a sentence for an error.

    ``nodes`` are ``ray.nodes()`` entries, ``available`` is ``ray.available_resources()``.
    """
    alive = [n.get("Resources", {}) for n in nodes if n.get("Alive")]
    total: dict[str, float] = {}
    for resources in alive:
        for name, value in resources.items():
            total[name] = total.get(name, 0.0) + float(value)
    wanted = {name: value for name, value in bundle.items() if value > 0}
    problems = []
    absent = sorted(name for name in wanted if total.get(name, 0.0) <= 0)
    if absent:
        problems.append("no node has " + ", ".join(repr(name) for name in absent))
    short = {name: value * num_workers for name, value in wanted.items()
             if name not in absent and value * num_workers > total.get(name, 0.0) + 1e-9}
    if short:
        problems.append("the workers need " + format_resources(short) + " in all, the cluster "
                        "has " + format_resources({n: total.get(n, 0.0) for n in short}))
    fitting = sum(all(float(r.get(name, 0.0)) + 1e-9 >= value for name, value in wanted.items())
                  for r in alive)
    if not absent and fitting == 0:
        problems.append("no node is large enough for one worker")
    elif strategy == "STRICT_SPREAD" and fitting < num_workers:
        problems.append(f"STRICT_SPREAD needs {num_workers} nodes that fit a worker, the cluster "
                        f"has {fitting}")
    everything = {name: value * num_workers for name, value in wanted.items()}
    if strategy == "STRICT_PACK" and not problems and not any(
            all(float(r.get(n, 0.0)) + 1e-9 >= v for n, v in everything.items())
            for r in alive):
        problems.append("STRICT_PACK needs one node with " + format_resources(everything))
    if not problems:
        busy = {name: value for name, value in everything.items()
                if available.get(name, 0.0) + 1e-9 < value}
        problems.append("the resources exist but are in use: available now "
                        + format_resources({n: available.get(n, 0.0) for n in busy or wanted})
                        + " (other runs or actors hold the rest, or a lost node has not been "
                        "replaced yet)")
    cluster = {n: v for n, v in total.items()
               if n not in _BOOKKEEPING and not n.startswith("node:")}
    return (f"{'; '.join(problems)}. The cluster has {len(alive)} alive "
            f"{'node' if len(alive) == 1 else 'nodes'} with {format_resources(cluster)}")


def count_fitting(bundle: dict[str, float], strategy: str, nodes: list[dict[str, Any]],
                  available: dict[str, float] | None = None) -> int:
    """How many ``bundle``s the alive ``nodes`` (``ray.nodes()`` entries) can hold at
    once under ``strategy``, from each node's total resources; with ``available``
    (``ray.available_resources()``) also at most what is free in the whole cluster now.

    An upper bound, not a promise: Ray reports free resources per cluster, not per node,
    so a placement of this many may still wait for resources in use. ``2**31`` when the
    bundle asks for nothing.
    """
    wanted = {name: value for name, value in bundle.items() if value > 0}
    unbounded = 2 ** 31

    def fits(resources: dict[str, Any]) -> int:
        counts = [math.floor(float(resources.get(name, 0.0)) / value + 1e-9)
                  for name, value in wanted.items()]
        return min(counts, default=unbounded)

    per_node = [fits(n.get("Resources", {})) for n in nodes if n.get("Alive")]
    if strategy == "STRICT_SPREAD":
        count = sum(1 for c in per_node if c >= 1)
    elif strategy == "STRICT_PACK":
        count = max(per_node, default=0)
    else:
        count = min(sum(per_node), unbounded)
    if available is not None:
        count = min(count, fits(available))
    return count


def worker_bundle(scaling: ScalingConfig) -> dict[str, float]:
    """The resources one worker's placement bundle holds."""
    if scaling.resources_per_worker:
        # As Ray Train: resources given as 0 are dropped, and a GPU worker asks for one
        # GPU unless resources_per_worker names a number.
        bundle = {name: value for name, value in scaling.resources_per_worker.items()
                  if value != 0}
        if scaling.use_gpu:
            bundle.setdefault("GPU", 1.0)
    else:
        # A GPU worker asks for no CPU, as Ray Train's: a GPU node started with
        # --num-cpus=0 (or all its CPUs taken by data loading) still places it.
        bundle = {"GPU": 1.0} if scaling.use_gpu else {"CPU": 1.0}
    # accelerator_type travels as Ray Train's custom resource, so the placement group
    # only lands on nodes that have that accelerator.
    bundle.update(scaling.additional_resources_per_worker)
    return bundle


def local_placement(node_of: Mapping[int, str]) -> dict[int, tuple[int, int]]:
    """rank -> (local rank, local world size) for ranks on the nodes of ``node_of``
    (rank -> node id): the ranks of a node numbered in rank order, as the controller's
    placement (``controller/attempt.py``) numbers them for each rank's context."""
    by_node: dict[str, list[int]] = {}
    for rank in sorted(node_of):
        by_node.setdefault(node_of[rank], []).append(rank)
    return {rank: (local_rank, len(ranks)) for ranks in by_node.values()
            for local_rank, rank in enumerate(ranks)}


def gpus_by_node(workers: Iterable[tuple[str, Sequence[str]]]) -> dict[str, list[str]]:
    """node id -> the GPU ids of all its workers (``(node id, GPU ids)`` pairs), sorted,
    each once (workers with fractional GPUs share an id)."""
    found: dict[str, set[str]] = {}
    for node_id, gpu_ids in workers:
        found.setdefault(node_id, set()).update(gpu_ids)
    return {node_id: sorted(ids, key=_gpu_order) for node_id, ids in found.items()}


def _gpu_order(gpu_id: str) -> tuple[bool, int, str]:
    """GPU ids by number (``2`` before ``10``), any others (UUIDs) after them."""
    return (not gpu_id.isdigit(), int(gpu_id) if gpu_id.isdigit() else 0, gpu_id)


def gpu_env(gpu_ids: Sequence[str], node_gpu_ids: Sequence[str]) -> dict[str, str]:
    """The variables of a worker with the GPUs ``gpu_ids`` on a node whose workers have
    ``node_gpu_ids``; none for a worker without GPUs.

    As Ray Train does: Ray makes only an actor's own GPUs visible to it, so that 8 workers
    on an 8-GPU node each see one device; every worker of the node sees all of the node's
    workers' GPUs instead (``CUDA_VISIBLE_DEVICES``, so that NCCL can reach its peers
    directly) and trains on the one at the index of its own (:data:`GPU_IDS_ENV`)."""
    if not gpu_ids:
        return {}
    return {"CUDA_VISIBLE_DEVICES": ",".join(node_gpu_ids), GPU_IDS_ENV: ",".join(gpu_ids)}
