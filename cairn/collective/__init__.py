"""Collective calls across the ranks of a run, as ``ray.train.collective``.

They go through the controller over the control channel, so they need no torch and work
on every backend. The n-th collective call of every rank is collective n; all ranks must
make the same calls in the same order, after the same number of ``report()`` calls. A
rank that does not arrive within ``FailureConfig.collective_timeout_s`` fails the attempt
with a :class:`cairn.CollectiveTimeoutError` naming the missing ranks.
"""

from __future__ import annotations

from typing import TypeVar

from cairn._src.worker.session import get_session

T = TypeVar("T")

__all__ = ["barrier", "broadcast_from_rank_zero"]


def barrier() -> None:
    """Wait until every rank called ``barrier()``."""
    get_session("collective.barrier").collectives.barrier()


def broadcast_from_rank_zero(data: T) -> T:
    """Rank 0's ``data`` on every rank (also a barrier).

    ``data`` must be picklable on rank 0 (a :class:`cairn.ReportError` otherwise); what the
    other ranks pass is ignored. Meant for small data: it travels through the driver.
    """
    return get_session("collective.broadcast_from_rank_zero").collectives.broadcast_from_rank_zero(
        data
    )
