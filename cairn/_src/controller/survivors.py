"""Keeping the survivors of a failure (``FailureConfig(keep_survivors=True)``).

When one rank fails, the controller may keep the other ranks' processes instead of
killing the whole group: :func:`plan_survivors` decides (pure, no I/O), the attempt's loop
stops the kept ranks' train functions (``StopMessage``; each answers ``StoppedMessage``
once idle), the backend kills and replaces only the failed rank, and the next attempt
sends each kept rank a ``RejoinMessage`` on its old connection: it connects again and
runs the train function for that attempt in the same process.

The whole group restarts, as without the option, when:

* the backend cannot replace one rank (a backend that is no :class:`RankReplacer`);
* the failure is fatal, or more than one rank failed on its own (two failures overlap);
* not every rank had connected, or no rank is left to keep;
* a rank to keep had not reached its train function: its set-up (a process group's
  rendezvous, which waits for the failed rank) cannot be stopped;
* a kept rank does not stop within ``FailureConfig.stop_timeout_s``, or the plan made
  again once the kept ranks stopped (what they sent meanwhile: an error of their own, a
  return, an exit) keeps a rank that did not stop.

Ranks on a node about to be reclaimed (a preemption notice) are never kept.

Where the next attempt's ranks restore the checkpoint it resumes from is decided here too
(:func:`plan_restores`, pure): a kept rank that holds the committed checkpoint in memory
(its last ``report_snapshot``, ``StoppedMessage.memory_copy``) restores from that copy; a
replaced rank, or a kept one without a copy, from the copies of kept peers that hold it;
storage for what no copy holds, or when a copy fails its checksums in the worker.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

from cairn._src.controller.worker_failures import WorkerFailure, cause_order
from cairn._src.wire.messages import MemoryCopyInfo, RestorePlan


@dataclass(frozen=True)
class SurvivorPlan:
    """``keep``: the ranks whose processes run the next attempt (empty: the whole group
    restarts, ``reason`` says why); ``replace``: the ranks started afresh."""

    keep: frozenset[int]
    replace: frozenset[int]
    reason: str


def plan_survivors(*, enabled: bool, can_replace: bool, ranks: Collection[int],
                   failures: list[WorkerFailure], exited: Collection[int],
                   connected: Collection[int], fatal: bool,
                   preempted: Collection[int] = (),
                   started: Collection[int] | None = None) -> SurvivorPlan:
    """Which ranks to keep after a failed attempt (pure). ``exited``: ranks whose process
    went or whose train function returned; ``preempted``: ranks on nodes about to be
    reclaimed (a preemption notice): neither can be kept. ``started``: the ranks whose
    train function began (None: not asked)."""
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
    replace = frozenset(causes | set(exited) | set(preempted))
    keep = everyone - replace
    if not keep:
        return whole("no rank is left to keep")
    if started is not None and not keep <= set(started):
        return whole(f"ranks {sorted(keep - set(started))} had not reached their train "
                     "function (a set-up, such as a process group's rendezvous, cannot be "
                     "stopped)")
    return SurvivorPlan(keep, replace, f"kept ranks {sorted(keep)}, replacing "
                        f"{sorted(replace)}")


@dataclass
class KeptRanks:
    """Ranks kept across a restart: their connections of the attempt that failed (the
    ``RejoinMessage`` goes there) and the ranks started afresh."""

    connections: dict[int, Connection]
    replace: frozenset[int]
    # What each kept rank holds in memory (StoppedMessage.memory_copy).
    copies: dict[int, MemoryCopyInfo | None] = field(default_factory=dict)

    @property
    def keep(self) -> list[int]:
        return sorted(self.connections)


def plan_restores(resume_index: int | None, kept: KeptRanks | None, world_size: int,
                  driver_files: Mapping[int, dict[str, bytes]] | None = None,
                  ) -> dict[int, RestorePlan]:
    """Where each rank of the next attempt restores the checkpoint of report
    ``resume_index`` from (pure; empty when the whole group restarts or nothing resumes).
    ``driver_files``: the small files each rank wrote for that checkpoint, as the driver
    kept them (:mod:`.driver_copies`); a rank without its own memory copy gets its own,
    and every rank those of the replaced ranks."""
    if kept is None or resume_index is None:
        return {}
    holders = {rank: info for rank, info in kept.copies.items()
               if info is not None and info.holds(resume_index)}
    plans: dict[int, RestorePlan] = {}
    for rank in range(world_size):
        own = rank in holders
        peers = tuple((peer, info.address[0], info.address[1])
                      for peer, info in sorted(holders.items())
                      if peer != rank and info.address is not None)
        if own:
            reason = "its own memory copy"
        elif rank in kept.copies:
            info = kept.copies[rank]
            reason = ("it holds no snapshot in memory" if info is None
                      else f"its memory copy is of report {info.report_index}"
                      if info.report_index >= 0
                      else f"it holds no memory copy of report {resume_index}")
        else:
            reason = "a replaced rank"
        if not own:
            reason += (f"; from peer rank {peers[0][0]}" if peers
                       else f"; no kept rank holds report {resume_index} in memory"
                       if not holders else "; no kept rank serves its copy")
        files = driver_files or {}
        mine = {} if own else dict(files.get(rank, {}))
        # The replaced ranks' own files: no kept rank holds them, and a restore of the
        # whole checkpoint (as_directory) wants every file.
        theirs = {rel: data for other in sorted(kept.replace) if other != rank
                  for rel, data in files.get(other, {}).items()}
        if mine:
            reason += f"; {len(mine)} small files of its own from the driver"
        if theirs:
            reason += f"; {len(theirs)} small files of replaced ranks from the driver"
        plans[rank] = RestorePlan(resume_index, own, peers, reason, {**theirs, **mine})
    return plans


def planned_source(plan: RestorePlan) -> tuple[str, int | None]:
    """The source a plan names first: ("memory" | "peer" | "driver" | "storage", the
    peer's rank)."""
    if plan.own_memory:
        return "memory", None
    if plan.peers:
        return "peer", plan.peers[0][0]
    if plan.driver_files:
        return "driver", None
    return "storage", None
