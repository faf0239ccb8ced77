"""Preemption notices: what a worker tells the controller, and what every rank then knows.

A node about to be reclaimed (a spot instance, a drained Ray node, a worker sent SIGTERM
on the local backend) is a *notice*: the worker that noticed it sends a
:class:`PreemptionNoticeMessage`; the controller maps the node to the ranks it hosts and
sends every rank a :class:`PreemptionMessage` with the merged :class:`PreemptionInfo`,
which ``cairn.get_preemption_info()`` returns (Ray Train 2.60's names and fields).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# How a notice was noticed (PreemptionNoticeMessage.source).
SIGTERM_SOURCE = "SIGTERM"
DRAIN_SOURCE = "drain"
# No notice came, but the backend says the worker was lost with a preempted node (Ray's
# RayActorError.preempted).
PREEMPTED_SOURCE = "node preempted"


@dataclass(frozen=True)
class PreemptionInfo:
    """An imminent preemption: which nodes, which ranks, and the reclaim deadline.

    ``deadline_ms`` is the earliest reclaim deadline (UNIX time in milliseconds) across
    the preempted nodes, ``None`` when no notice carried one; ``preempted_node_to_ranks``
    maps each preempted node's id to the world ranks it hosts.
    """

    deadline_ms: int | None
    preempted_node_to_ranks: dict[str, list[int]]

    @property
    def preempted_node_ids(self) -> list[str]:
        """Preempted node ids, sorted."""
        return sorted(self.preempted_node_to_ranks)

    @property
    def preempted_ranks(self) -> list[int]:
        """Every rank on a preempted node, ascending."""
        return sorted({r for ranks in self.preempted_node_to_ranks.values() for r in ranks})


def merge_preemption_info(old: PreemptionInfo | None, new: PreemptionInfo) -> PreemptionInfo:
    """One info covering both: every node of either, the earliest deadline."""
    if old is None:
        return new
    nodes: dict[str, set[int]] = {}
    for info in (old, new):
        for node, ranks in info.preempted_node_to_ranks.items():
            nodes.setdefault(node, set()).update(ranks)
    deadlines = [d for d in (old.deadline_ms, new.deadline_ms) if d is not None]
    return PreemptionInfo(deadline_ms=min(deadlines, default=None),
                          preempted_node_to_ranks={n: sorted(r) for n, r in nodes.items()})


def info_for_node(node_id: str, deadline_ms: int | None,
                  ranks_by_node: Iterable[tuple[int, str]]) -> PreemptionInfo:
    """The info of a notice for ``node_id``: every rank of ``ranks_by_node`` on it."""
    ranks = sorted(rank for rank, node in ranks_by_node if node == node_id)
    return PreemptionInfo(deadline_ms=deadline_ms, preempted_node_to_ranks={node_id: ranks})


@dataclass(frozen=True)
class PreemptionNoticeMessage:
    """Worker -> controller: the node this rank runs on is about to be reclaimed (the
    controller knows which node that is).

    ``source`` says how the worker learned it (:data:`SIGTERM_SOURCE`,
    :data:`DRAIN_SOURCE`); ``deadline_ms`` is the reclaim deadline if the notice had one.
    """

    rank: int
    deadline_ms: int | None
    source: str


@dataclass(frozen=True)
class PreemptionMessage:
    """Controller -> every rank: the preemption in progress (the merged info so far)."""

    info: PreemptionInfo
