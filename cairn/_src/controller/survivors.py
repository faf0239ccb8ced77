"""Keeping the survivors of a failure (``FailureConfig(keep_survivors=True)``).

When one rank fails, the controller may keep the other ranks' processes instead of
killing the whole group: :func:`plan_survivors` decides (pure, no I/O), the attempt's loop
stops the kept ranks' train functions (``StopMessage``; each answers ``StoppedMessage``
once idle), the backend kills and replaces only the failed rank, and the next attempt
sends each kept rank a ``RejoinMessage`` on its old connection: it connects again and
runs the train function for that attempt in the same process.

The whole group restarts, as without the option, when:

* the backend cannot replace one rank (the Ray backend);
* the failure is fatal, or more than one rank failed on its own (two failures overlap);
* not every rank had connected, or no rank is left to keep;
* a kept rank does not stop within ``FailureConfig.stop_timeout_s``, or dies meanwhile.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from multiprocessing.connection import Connection

from cairn._src.controller.worker_failures import WorkerFailure, cause_order


@dataclass(frozen=True)
class SurvivorPlan:
    """``keep``: the ranks whose processes run the next attempt (empty: the whole group
    restarts, ``reason`` says why); ``replace``: the ranks started afresh."""

    keep: frozenset[int]
    replace: frozenset[int]
    reason: str


def plan_survivors(*, enabled: bool, can_replace: bool, ranks: Collection[int],
                   failures: list[WorkerFailure], exited: Collection[int],
                   connected: Collection[int], fatal: bool) -> SurvivorPlan:
    """Which ranks to keep after a failed attempt (pure)."""
    everyone = frozenset(ranks)

    def whole(reason: str) -> SurvivorPlan:
        return SurvivorPlan(frozenset(), everyone, reason)

    if not enabled:
        return whole("FailureConfig(keep_survivors=False)")
    if not can_replace:
        return whole("the backend cannot replace a single rank")
    if fatal:
        return whole("the failure is fatal")
    if set(connected) != set(everyone):
        return whole("not every rank had connected")
    causes = {f.rank for f in failures if cause_order(f) == 0}
    if len(causes) > 1:
        return whole(f"{len(causes)} ranks failed at once ({sorted(causes)})")
    replace = frozenset(causes | set(exited))
    keep = everyone - replace
    if not keep:
        return whole("no rank is left to keep")
    return SurvivorPlan(keep, replace, f"kept ranks {sorted(keep)}, replacing "
                        f"{sorted(replace)}")


@dataclass
class KeptRanks:
    """Ranks kept across a restart: their connections of the attempt that failed (the
    ``RejoinMessage`` goes there) and the ranks started afresh."""

    connections: dict[int, Connection]
    replace: frozenset[int]

    @property
    def keep(self) -> list[int]:
        return sorted(self.connections)
