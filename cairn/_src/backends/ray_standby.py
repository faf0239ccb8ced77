"""Warm spare worker actors for the Ray backend (``FailureConfig(warm_standby=True)``).

A restart on Ray starts a new worker process per rank: Ray's worker boots (its own
imports, at Ray's low worker priority), then imports Cairn's worker runtime, all on the
path from the failure to the first step. On a loaded node that takes seconds and swings
with the load. With warm standby the backend keeps spare actors, booted and with their
imports done while the attempt trains: one per rank on the group's nodes and one on each
other node that fits a worker (one more in all than the group has). The next attempt
runs its ranks in the spares on the nodes its placement group chose, and starts fresh
actors only where no spare is left.

A spare asks Ray for no resources (``num_cpus=0``), pinned to its node: the placement
group's bundle still reserves the rank's resources, and the rank runs in the spare on the
bundle's node. Ray sets a GPU's visibility for the actor that asks for it, so workers with
GPUs (``use_gpu`` or a ``"GPU"`` in ``resources_per_worker``) get no spares.
"""

from __future__ import annotations

import logging
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

logger = logging.getLogger(__name__)


class RayStandby:
    """The spare actors, by node id; owned by the controller's thread, like the backend."""

    def __init__(self, actor_class: Any) -> None:
        self._actor_class = actor_class
        # node id -> [(actor, its warm() ref)]
        self._spares: dict[str, list[tuple[Any, Any]]] = {}

    @staticmethod
    def applies(bundle: dict[str, float]) -> bool:
        """Whether spares can stand in for a worker with this bundle (no GPU)."""
        return bundle.get("GPU", 0.0) <= 0

    def prepare(self, wanted: dict[str, int], runtime_env: dict[str, Any] | None,
                preload: list[str], path: list[str]) -> None:
        """Spares on each node of ``wanted`` up to its count (node id -> spares)."""
        started = []
        for node_id, count in wanted.items():
            spares = self._spares.setdefault(node_id, [])
            while len(spares) < count:
                options: dict[str, Any] = {
                    "num_cpus": 0,
                    "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False),
                    "max_restarts": 0,
                }
                if runtime_env:
                    options["runtime_env"] = runtime_env
                actor = self._actor_class.options(**options).remote()
                spares.append((actor, actor.warm.remote(preload, path)))
                started.append(node_id[:12])
        if started:
            logger.debug("Started warm standby Ray worker actors on nodes %s",
                         ", ".join(started))

    def take(self, node_id: str) -> Any | None:
        """A spare on ``node_id`` for a rank (one still booting is ahead of a fresh actor),
        or None if none is left there; spares that died (their node lost) are dropped."""
        spares = self._spares.get(node_id, [])
        while spares:
            actor, ref = spares.pop(0)
            done, _ = ray.wait([ref], timeout=0)
            if done:
                try:
                    ray.get(ref)
                except ray.exceptions.RayError as exc:
                    logger.debug("Warm standby actor on node %s is gone: %s", node_id[:12],
                                 type(exc).__name__)
                    _kill(actor)
                    continue
            return actor
        return None

    def stop(self) -> None:
        """The run is over: every spare goes."""
        spares, self._spares = self._spares, {}
        for node_spares in spares.values():
            for actor, _ in node_spares:
                _kill(actor)


def _kill(actor: Any) -> None:
    try:
        ray.kill(actor, no_restart=True)
    except Exception as exc:  # already gone with its node
        logger.debug("Could not kill a warm standby actor: %s", exc)
