"""One attempt's preemption: the notices its workers sent, the deadline, and how it ends.

Ray Train 2.60's semantics, which Cairn follows:

* A *notice* (a worker's node is about to be reclaimed) does not stop the attempt. Every
  rank learns it (``cairn.get_preemption_info()``) and may save a just-in-time checkpoint;
  training goes on.
* The attempt then ends in one of three ways: every rank returns (the run finishes, as any
  run does); a worker goes (its node was reclaimed: the restart is a preemption, also when
  other ranks then failed in a collective); or the reclaim deadline, plus
  ``FailureConfig.preemption_grace_s``, passes with workers still running (Cairn tears them
  down: ``drain_timed_out``). A rank that raises its own error while no worker has gone is
  an ordinary failure.
* A preemption restart counts against ``max_preemption_failures`` (``-1``: no limit), never
  against ``max_failures``; the next attempt resumes from the latest committed checkpoint,
  the just-in-time one included.

:class:`AttemptPreemption` is pure bookkeeping for the controller loop's thread; the loop
sends the messages and ends the attempt.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from cairn._src.config.failure import FailureConfig
from cairn._src.controller.clock import Clock
from cairn._src.controller.failure_policy import AttemptFailure
from cairn._src.controller.worker_failures import WorkerFailure
from cairn._src.errors import PreemptionError, WorkerGroupError
from cairn._src.wire.preemption import (
    PreemptionInfo,
    PreemptionNoticeMessage,
    info_for_node,
    merge_preemption_info,
)

logger = logging.getLogger(__name__)


class AttemptPreemption:
    """The preemption state of one attempt (``info`` is None until a notice arrives)."""

    def __init__(self, nodes_by_rank: Sequence[tuple[int, str]], config: FailureConfig,
                 clock: Clock) -> None:
        self._nodes_by_rank = list(nodes_by_rank)
        self._deadline_s = float(config.preemption_deadline_s)
        self._grace_s = float(config.preemption_grace_s)
        self._relax = config.relax_collectives_on_preemption
        self._clock = clock
        self.info: PreemptionInfo | None = None
        self._noticed_at: float | None = None

    def on_notice(self, message: PreemptionNoticeMessage) -> PreemptionInfo | None:
        """Fold in a worker's notice; the merged info when it changed (to send every
        rank), else None (a second notice from the same node)."""
        node = dict(self._nodes_by_rank).get(message.rank)
        if node is None:
            return None
        merged = merge_preemption_info(self.info, info_for_node(
            node, message.deadline_ms, self._nodes_by_rank))
        if merged == self.info:
            return None
        if self._noticed_at is None:
            self._noticed_at = self._clock.time()
        self.info = merged
        logger.warning("Preemption notice (%s) from rank %d: nodes %s (ranks %s) are about "
                       "to be reclaimed, deadline %s", message.source, message.rank,
                       merged.preempted_node_ids, merged.preempted_ranks,
                       self.describe_deadline())
        if self._relax:
            logger.warning("FailureConfig(relax_collectives_on_preemption=True) has no effect "
                           "in Cairn: a checkpoint commits only with every rank's report, so "
                           "make the just-in-time report while every rank still runs")
        return merged

    def deadline_t(self) -> float | None:
        """When the workers are torn down (UNIX seconds): the notice's deadline, or
        ``preemption_deadline_s`` after the notice, plus ``preemption_grace_s``."""
        if self.info is None or self._noticed_at is None:
            return None
        reclaim = (self.info.deadline_ms / 1000.0 if self.info.deadline_ms is not None
                   else self._noticed_at + self._deadline_s)
        return reclaim + self._grace_s

    def describe_deadline(self) -> str:
        deadline = self.deadline_t()
        if deadline is None:
            return "none"
        return f"in {max(0.0, deadline - self._clock.time()):.1f}s"

    def deadline_passed(self) -> bool:
        deadline = self.deadline_t()
        return deadline is not None and self._clock.time() >= deadline

    def caused(self, failures: Iterable[WorkerFailure]) -> bool:
        """Whether failures seen while a notice is in force are the preemption: a rank of
        a noticed node that went (exited, was killed or lost its connection, no error of
        its own) is, and then the errors of the other ranks count as its consequences
        (Ray: "the preemption wins"). A rank elsewhere that crashes meanwhile is an
        ordinary failure."""
        if self.info is None:
            return False
        noticed = set(self.info.preempted_ranks)
        return any(f.went and f.exception is None and not f.traceback and f.rank in noticed
                   for f in failures)


def preemption_error(failure: AttemptFailure, error: WorkerGroupError,
                     run_path: str) -> PreemptionError:
    """The error ``fit()`` raises once preemptions spent ``max_preemption_failures``: Ray's
    :class:`PreemptionError`, with how the workers went; the ranks' own errors (a killed
    rank's, the collectives that then lost it) stay in ``worker_failures``."""
    assert failure.preemption is not None
    detail = ("the deadline passed with workers still running" if failure.drain_timed_out
              else failure.reason.splitlines()[0])
    return PreemptionError(failure.preemption, failure.drain_timed_out, detail, run_path,
                           worker_failures=error.worker_failures)
