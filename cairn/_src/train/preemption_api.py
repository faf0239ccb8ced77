"""``get_preemption_info()``: whether a node of the run is about to be reclaimed.

Thin, like ``api.py``: it finds the worker's session and hands off.
"""

from __future__ import annotations

from cairn._src.wire.preemption import PreemptionInfo
from cairn._src.worker.session import get_session


def get_preemption_info() -> PreemptionInfo | None:
    """The preemption in progress, or None (Ray Train 2.60's name and contract).

    None until a node hosting one of the run's workers is about to be reclaimed: on the
    local backend a ``SIGTERM`` to a worker process, on the Ray backend a drain of a node
    (``ray drain-node``, the autoscaler's preemption notice). Then a
    :class:`PreemptionInfo` naming the nodes, their ranks and the reclaim deadline. Save a
    just-in-time checkpoint (a SYNC report) and keep training: once the node goes, or the
    deadline passes, the run restarts from the latest committed checkpoint, counted
    against ``FailureConfig.max_preemption_failures``, not ``max_failures``. A train
    function that returns normally still finishes the run.

    Every rank gets the same answer: the call is a broadcast from rank 0, so call it the
    same number of times on every rank, as Ray asks.
    """
    session = get_session("get_preemption_info")
    preemption = getattr(session, "preemption", None)
    if preemption is None:  # a session with no workers to preempt (local mode)
        return None
    info: PreemptionInfo | None = session.collectives.broadcast_from_rank_zero(
        preemption.local_info)
    return info
