"""Driver-side callbacks: follow a run from the process that called ``fit()``.

Two interfaces, both accepted in ``RunConfig(callbacks=[...])``: Cairn's
:class:`Callback` (``on_report``, ``on_checkpoint``, ``on_failure``, ``on_run_end``) and
Ray Train v2's :class:`UserCallback` (``after_report``, ``after_exception``). The
controller calls them through one :class:`CallbackDispatcher`, an observer of the run's
events (:mod:`.observer`).
"""

from __future__ import annotations

import copy
import heapq
import logging
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cairn._src.errors import ControllerError
from cairn._src.observe.driver_events import (
    AttemptFailed,
    CheckpointCommitted,
    CheckpointSkipped,
    CommitFailed,
    Reported,
    WorkerGroupStarted,
)
from cairn._src.observe.observer import ObservedEvent

if TYPE_CHECKING:
    from cairn._src.checkpoint.checkpoint import Checkpoint
    from cairn._src.config.run import RunConfig, ScalingConfig
    from cairn._src.errors import WorkerGroupError
    from cairn._src.train.result import Result

logger = logging.getLogger(__name__)


class Callback:
    """Subclass and override what you need; pass instances in ``RunConfig(callbacks=[...])``.

    Hooks run on the driver's controller thread, in order: keep them quick (hand slow work,
    such as posting to a tracking server, to a thread of your own). Each hook gets its own
    deep copy of the metrics: what it changes there reaches neither the run (its checks,
    checkpoints, history and :class:`~cairn.Result`) nor the other callbacks. An exception
    in a hook fails the run with a :class:`~cairn.ControllerError` wrapping it, as in Ray
    Train. Any object with some of these methods works too.
    """

    def on_report(self, report_index: int, metrics: dict[str, Any]) -> None:
        """Rank 0 reported ``metrics`` as report ``report_index`` (not yet committed)."""

    def on_checkpoint(self, dir_name: str, metrics: dict[str, Any]) -> None:
        """The checkpoint ``dir_name`` was committed."""

    def on_failure(self, error: BaseException) -> None:
        """An attempt failed (whether or not it will be retried)."""

    def on_run_end(self, result: Result) -> None:
        """``fit()`` is about to return or raise ``result.error``."""


@dataclass(frozen=True)
class TrainRunContext:
    """What a :class:`UserCallback` learns about the run, as in Ray Train."""

    run_config: RunConfig
    train_loop_config: dict[str, Any] | None
    scaling_config: ScalingConfig
    # Unique per fit() call, as Ray Train's (the run's name is run_config.name).
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex, compare=False)

    def get_run_config(self) -> RunConfig:
        return self.run_config


class UserCallback:
    """Ray Train v2's callback interface, called on the driver (never in a worker).

    * ``after_report`` once every rank has made report n, in report order: with
      ``checkpoint=None`` for a metric-only report, or once the report's checkpoint is
      committed, with that :class:`~cairn.Checkpoint`. ``metrics[i]`` is what rank ``i``
      reported.
    * ``after_exception`` when an attempt fails, with ``{rank: exception}``: the
      exception each failed rank's train function raised, or a
      :class:`~cairn.WorkerProcessError` for a rank that exited, was killed or hung.

    ``metrics`` is the hook's own deep copy, as for :class:`Callback`. An exception in a
    hook fails the run with a :class:`~cairn.ControllerError`.
    """

    def after_report(
        self,
        run_context: TrainRunContext,
        metrics: list[dict[str, Any]],
        checkpoint: Checkpoint | None,
    ) -> None:
        """Every rank reported; ``checkpoint`` is committed (None: no rank passed one)."""

    def after_exception(
        self, run_context: TrainRunContext, worker_exceptions: dict[int, BaseException]
    ) -> None:
        """One or more workers failed: ``worker_exceptions`` maps ranks to exceptions."""


def call_hooks(callbacks: Sequence[Any], hook: str, *args: Any,
               copied: int | None = None) -> None:
    """Call ``hook(*args)`` on every callback that has it, in order. One that raises stops
    the others; its exception is logged and re-raised as :class:`ControllerError`.

    ``copied``: the position in ``args`` of the metrics, of which each callback gets a deep
    copy of its own (the run goes on using the original: its checks, commit and history).
    """
    for callback in callbacks:
        method = getattr(callback, hook, None)
        if method is None:
            continue
        given = args
        if copied is not None:
            # Metrics are plain JSON values (report() checked them): the copy cannot fail.
            given = (*args[:copied], copy.deepcopy(args[copied]), *args[copied + 1:])
        try:
            method(*given)
        except Exception as exc:
            logger.exception("Callback %s raised in %s", type(callback).__name__, hook)
            raise ControllerError(exc) from exc


def _chain_to_failure(error: ControllerError, failure: WorkerGroupError) -> None:
    """Show the attempt's ``failure`` with the error of a hook called for it: the hook's
    exception gets it as its ``__context__`` (as if raised while handling it), so that the
    traceback shows the worker's error first, and ``error`` a note with its first line."""
    raised = error.controller_failure
    if raised is not failure and raised.__context__ is None:
        raised.__context__ = failure
    if sys.version_info >= (3, 11):
        first = (failure.error_message.splitlines() or [""])[0]
        error.add_note(f"The callback was called for this failure of the attempt: {first}")


@dataclass
class _PendingReport:
    metrics: dict[int, dict[str, Any]] = field(default_factory=dict)
    has_checkpoint: bool = False
    resolved: bool = False
    checkpoint: Checkpoint | None = None


class CallbackDispatcher:
    """Calls every callback's hooks at the right moment; owned by the controller thread.

    ``after_report`` is called in report order: report n waits until every rank reported
    it and, when it carries a checkpoint, until that checkpoint is committed (or skipped),
    and until reports before n were delivered. Reports of a failed attempt that never
    completed are dropped, as the attempt's reports are. Every hook gets its own deep copy
    of the metrics; the reports' own stay as the workers sent them. A hook that raises is
    logged and re-raised as :class:`ControllerError`; one called for a failed attempt
    chains the attempt's error to it.
    """

    def __init__(self, callbacks: Sequence[Any], run_context: TrainRunContext,
                 world_size: int) -> None:
        self._callbacks = list(callbacks)
        self._context = run_context
        self._world_size = world_size
        self._pending: dict[int, _PendingReport] = {}
        # The indices of _pending, smallest first: delivery takes the lowest in O(log n)
        # (ranks far apart keep many reports pending).
        self._order: list[int] = []
        # Reports up to this index were delivered; later news of them (a second rank's
        # skipped upload, say) is ignored. Indices only grow, across attempts too.
        self._delivered_through = 0

    def set_world_size(self, world_size: int) -> None:
        """The size of the attempt starting now (an elastic run's may differ from the
        last); reports of earlier attempts still pending are dropped, as they are."""
        self._world_size = world_size

    def _call(self, hook: str, *args: Any, copied: int | None = None) -> None:
        call_hooks(self._callbacks, hook, *args, copied=copied)

    def notify(self, event: ObservedEvent) -> None:
        """An event of the run (the :class:`~.observer.Observer` protocol): reports,
        commits, skipped checkpoints and failed attempts call the hooks; the others are
        ignored."""
        if isinstance(event, Reported):
            message = event.message
            self.reported(message.rank, message.index, message.metrics,
                          message.checkpoint is not None)
        elif isinstance(event, CheckpointCommitted):
            self.committed(event.ready.index, event.view.dir_name, event.ready.metrics,
                           event.checkpoint)
        elif isinstance(event, CheckpointSkipped) or (
                isinstance(event, CommitFailed) and event.skipped):
            self.skipped(event.index if isinstance(event, CheckpointSkipped)
                         else event.ready.index)
        elif isinstance(event, AttemptFailed):
            self.failed(event.error)
        elif isinstance(event, WorkerGroupStarted):
            self.set_world_size(event.world_size)

    def reported(self, rank: int, index: int, metrics: dict[str, Any],
                 has_checkpoint: bool) -> None:
        """Rank ``rank`` made report ``index`` (every rank's report comes through here)."""
        if rank == 0:
            self._call("on_report", index, metrics, copied=1)
        if index <= self._delivered_through:
            return
        pending = self._pending_report(index)
        pending.metrics[rank] = metrics  # the report's own, copied when delivered
        pending.has_checkpoint = pending.has_checkpoint or has_checkpoint
        if len(pending.metrics) == self._world_size and not pending.has_checkpoint:
            pending.resolved = True
        self._deliver()

    def committed(self, index: int, dir_name: str, metrics: dict[str, Any],
                  checkpoint: Checkpoint) -> None:
        """The checkpoint of report ``index`` was committed."""
        self._call("on_checkpoint", dir_name, metrics, copied=1)
        if index <= self._delivered_through:
            return
        pending = self._pending_report(index)
        pending.has_checkpoint = True
        pending.resolved = True
        pending.checkpoint = checkpoint
        self._deliver()

    def skipped(self, index: int) -> None:
        """The checkpoint of report ``index`` was dropped (``upload_failure_policy="skip"``):
        its report is delivered without one."""
        if index <= self._delivered_through:
            return
        pending = self._pending_report(index)
        pending.has_checkpoint = True
        pending.resolved = True
        self._deliver()

    def failed(self, error: WorkerGroupError) -> None:
        """An attempt failed with ``error``; its undelivered reports are dropped."""
        self._pending.clear()
        self._order.clear()
        try:
            self._call("after_exception", self._context, dict(error.worker_failures))
            self._call("on_failure", error)
        except ControllerError as exc:
            _chain_to_failure(exc, error)
            raise

    def _pending_report(self, index: int) -> _PendingReport:
        pending = self._pending.get(index)
        if pending is None:
            pending = self._pending[index] = _PendingReport()
            heapq.heappush(self._order, index)
        return pending

    def _deliver(self) -> None:
        while self._order:
            index = self._order[0]
            pending = self._pending[index]
            if not pending.resolved or len(pending.metrics) < self._world_size:
                return
            heapq.heappop(self._order)
            del self._pending[index]
            self._delivered_through = index
            metrics = [pending.metrics[rank] for rank in range(self._world_size)]
            self._call("after_report", self._context, metrics, pending.checkpoint, copied=1)
