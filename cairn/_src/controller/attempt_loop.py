"""One attempt's event loop: the controller's waits, and what it does with each message.

:meth:`AttemptLoop.turn` waits once, without polling, on the workers' connections, on
their exit notifications and on the controller's :class:`Inbox` (new connections, commit
results), handles what arrived, runs the progress checks, and sets :attr:`AttemptLoop.ended`
once the attempt is over: :data:`FINISHED` (every rank done, every commit resolved) or the
:class:`AttemptFailure`. All of it runs on the controller loop's thread.

When a rank fails, the surviving ranks get a short, bounded grace (``REPORT_GRACE_S``) to
finish the reports up to the failed rank's last report; those are committed, then the
attempt is torn down and restarted (:meth:`AttemptLoop._reports_still_coming`). With no
rank left to report, the same grace lets failed ranks finish the ASYNC uploads of reports
every rank made. A fatal failure, or a lost lease, ends the attempt at once.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Final

from cairn._src.backends.protocol import WorkerBackend, WorkerHandle
from cairn._src.checkpoint.manager import CheckpointManager
from cairn._src.config.run import RunConfig
from cairn._src.controller.attempt import Attempt
from cairn._src.controller.clock import Clock
from cairn._src.controller.commit_pipeline import CommitPipeline
from cairn._src.controller.connections import WorkerChannels
from cairn._src.controller.driver_copies import DriverCopies
from cairn._src.controller.failure_policy import AttemptFailure
from cairn._src.controller.inbox import CommitResult, Inbox, NewConnection
from cairn._src.controller.preemption import AttemptPreemption
from cairn._src.controller.progress import check_progress
from cairn._src.controller.report_outcomes import (
    driver_failure,
    not_handed_to_commit,
    upload_failed,
)
from cairn._src.controller.reports import Verdict, describe_ranks
from cairn._src.controller.services import AttemptServices
from cairn._src.controller.validations import ValidationRunner
from cairn._src.controller.worker_failures import (
    WorkerFailure,
    cause_order,
    describe_lost,
    group_failures,
    ordered_ranks,
)
from cairn._src.errors import ReportError, StorageError
from cairn._src.observe.driver_events import Notice, Reported, Uploaded
from cairn._src.observe.live_view import LiveView
from cairn._src.observe.observer import EventStream
from cairn._src.run.events import (
    Blocked,
    CheckpointStarted,
    FirstReport,
    PreemptionNotice,
    Restored,
    TrainEnd,
    TrainStart,
    WorkersReady,
)
from cairn._src.run.segment_log import SegmentLog
from cairn._src.wire.messages import (
    DoneMessage,
    ErrorMessage,
    MemoryCopyInfo,
    ProceedMessage,
    RejectMessage,
    ReportMessage,
    RestoredMessage,
    SetupMessage,
    StopMessage,
    StoppedMessage,
    TimingMessage,
    UploadedMessage,
    UploadFailedMessage,
)
from cairn._src.wire.preemption import (
    PREEMPTED_SOURCE,
    PreemptionMessage,
    PreemptionNoticeMessage,
)

logger = logging.getLogger(__name__)

# How long to wait, after the first failure of an attempt, for other ranks' errors to
# arrive so they are reported together (not past the moment every rank has failed, exited,
# finished or waits inside a collective call).
FAILURE_GRACE_S = 0.2
# How long, after a rank failed, the surviving ranks may take to finish the reports up to
# the failed rank's last report, so that those are committed before the teardown.
REPORT_GRACE_S = 10.0
HISTORY_FLUSH_S = 1.0
# Workers that have not connected by then are reported (a node that cannot reach the
# controller, an interpreter that hangs while importing).
WORKER_START_TIMEOUT_S = 300.0


class _Finished:
    def __repr__(self) -> str:
        return "FINISHED"


FINISHED: Final = _Finished()


@dataclass
class RunProgress:
    """What the run learned from its reports, across attempts (the loop's thread)."""

    next_report_index: int
    last_metrics: dict[str, Any] = field(default_factory=dict)
    # The report index of last_metrics: Result.metrics adds its checkpoint's validation.
    last_report_index: int | None = None


@dataclass(frozen=True)
class LoopParts:
    """The collaborators an attempt's loop acts through.

    ``events`` is where every event is emitted, once, to the run's observers (the event
    log, the metrics history, the live view, the callbacks: :mod:`cairn._src.observe.
    observer`). ``view`` is here only to be started and stopped; ``history`` and
    ``event_log`` only to be flushed."""

    backend: WorkerBackend
    inbox: Inbox
    channels: WorkerChannels
    commits: CommitPipeline
    validations: ValidationRunner
    events: EventStream
    view: LiveView
    clock: Clock
    manager: CheckpointManager
    history: SegmentLog
    event_log: SegmentLog
    run_config: RunConfig
    # An observer of ``events``: the ranks' small files, for their replacements.
    driver_copies: DriverCopies


class AttemptLoop:
    """The event loop of one attempt (the controller loop's thread)."""

    def __init__(self, attempt: Attempt, parts: LoopParts, progress: RunProgress,
                 services: AttemptServices, *, registrations: bytes,
                 setup_message: Callable[[Attempt, int], SetupMessage]) -> None:
        self.attempt = attempt
        self._parts = parts
        self._progress = progress
        self._services = services
        self._registrations = registrations
        self._setup_message = setup_message
        self._clock = parts.clock
        self.exited: set[int] = set()
        # Ranks whose train function has ended and that wait to rejoin (keep_survivors).
        self.stopped: set[int] = set()
        # What each stopped rank holds in memory (keep_survivors: see survivors.py).
        self.copies: dict[int, MemoryCopyInfo | None] = {}
        self.ended: AttemptFailure | _Finished | None = None
        self._failure_deadline: float | None = None
        self._report_deadline: float | None = None
        self._next_flush = self._clock.monotonic() + HISTORY_FLUSH_S
        # Notices of nodes about to be reclaimed, and the deadline they set (preemption.py).
        self.preemption = AttemptPreemption([(w.rank, w.node_id) for w in attempt.workers],
                                            parts.run_config.failure_config, parts.clock)

    @property
    def all_connected(self) -> bool:
        return len(self.attempt.connected) == len(self.attempt.workers)

    def turn(self) -> None:
        """Wait once (at most a second) and handle what arrived; sets :attr:`ended`."""
        attempt, clock = self.attempt, self._clock
        timeout_s = self._parts.run_config.failure_config.collective_timeout_s
        watchers = {w.exit_watcher.fileno(): w for w in attempt.workers
                    if w.rank not in self.exited}
        now = clock.monotonic()
        # A failure deadline already past while the report grace runs: wait for
        # messages, exits or the grace's own deadline instead of spinning.
        upcoming = [d for d in (self._failure_deadline, self._report_deadline,
                                attempt.exit_awaited_until(now)) if d is not None and d > now]
        deadline = min([*upcoming, self._next_flush, now + 1.0])
        ready = self._wait_and_read(watchers, max(0.0, deadline - now))
        self._on_exits([watchers[item] for item in ready
                        if isinstance(item, int) and item in watchers])
        if clock.monotonic() >= self._next_flush:
            self.flush_logs()
            self._next_flush = clock.monotonic() + HISTORY_FLUSH_S
        if not attempt.failures:
            self._check_progress(timeout_s)
            self._check_started()
        if attempt.failures:
            if self._failure_deadline is None:
                self._failure_deadline = clock.monotonic() + FAILURE_GRACE_S
                if not attempt.fatal:
                    self._report_deadline = clock.monotonic() + REPORT_GRACE_S
            if (self._report_deadline is not None and clock.monotonic() < self._report_deadline
                    and self._reports_still_coming()):
                return
            # Every rank failed, exited, finished or waits inside a collective call (one that
            # a failed rank will never reach): no other error can still come.
            accounted = (self.exited | {f.rank for f in attempt.failures} | set(attempt.done)
                         | self._services.collectives.waiting())
            if ((clock.monotonic() >= self._failure_deadline
                    or len(accounted) == len(attempt.workers))
                    and attempt.exit_awaited_until(clock.monotonic()) is None):
                preempted = self.preemption.caused(attempt.failures)
                self.ended = AttemptFailure(
                    # The rank that caused the failure first (a killed rank before the
                    # ranks whose collective then lost it).
                    ranks=tuple(ordered_ranks(attempt.failures)),
                    reason=group_failures(attempt.failures),
                    fatal=attempt.fatal,
                    preemption=self.preemption.info if preempted else None,
                )
            return
        if len(attempt.done) == len(attempt.workers) and attempt.commits_in_flight == 0:
            self.ended = FINISHED
        elif self.preemption.info is not None and self.preemption.deadline_passed():
            info = self.preemption.info
            self.ended = AttemptFailure(
                ranks=tuple(info.preempted_ranks), preemption=info, drain_timed_out=True,
                reason=f"the reclaim deadline of the preempted nodes {info.preempted_node_ids} "
                "passed with workers still running; Cairn stopped them")

    def _reports_still_coming(self) -> bool:
        """Whether reports the failed ranks reached may still complete.

        A rank that fails must not cost the others the reports it already passed: until
        every report up to the failed ranks' last one is resolved (committed, skipped or
        refused), and while a rank that has not failed still runs, the attempt waits (at
        most ``REPORT_GRACE_S``), then tears down and restarts. Ray Train's report() is a
        barrier, so there these reports commit too.

        With no surviving rank, the reports every rank made may still complete: a failed
        rank finishes its ASYNC uploads before its process exits (``worker.main``), and
        the attempt waits for them in the same grace while such a rank is still connected.
        A rank that was killed, or whose connection ended, cannot finish its uploads.
        """
        attempt, tracker = self.attempt, self.attempt.tracker
        failed = {f.rank for f in attempt.failures}
        target = max((tracker.last_index.get(rank, 0) for rank in failed), default=0)
        if target < attempt.first_report_index:
            return False
        surviving = ({w.rank for w in attempt.workers} - self.exited - failed
                     - set(attempt.done))
        if not surviving:
            uploading = {rank for rank in failed if rank in attempt.connections} - self.exited
            return bool(uploading) and any(not tracker.missing_ranks(index)
                                           for index in tracker.unresolved_before(target))
        # A surviving rank whose connection ended can report nothing more; one that has not
        # connected yet (still starting on a loaded machine) still can.
        if any(rank in attempt.connected and rank not in attempt.connections
               for rank in surviving):
            return False
        return bool(tracker.unresolved_before(target)) or attempt.commits_in_flight > 0

    def _check_started(self) -> None:
        attempt = self.attempt
        if self.all_connected:
            return
        if self._clock.time() - attempt.started_at > WORKER_START_TIMEOUT_S:
            missing = sorted({w.rank for w in attempt.workers} - attempt.connected)
            attempt.failures.append(WorkerFailure(
                rank=missing[0], traceback="",
                summary=f"{describe_ranks(missing)} did not connect to the controller within "
                f"{WORKER_START_TIMEOUT_S:g}s of starting"))

    def _check_progress(self, timeout_s: float) -> None:
        attempt = self.attempt
        # Collectives and get_all_reported_checkpoints(): answer what can be answered
        # (timeouts included), then look for calls that never can be.
        self._services.answer(attempt.tracker, self._send)
        collective = self._services.check(attempt.tracker, attempt.done, timeout_s)
        if collective is not None:
            attempt.fatal = attempt.fatal or collective.fatal
            attempt.failures.append(collective.as_failure())
            return
        problem = check_progress(attempt.tracker, attempt.done,
                                 num_workers=len(attempt.workers), timeout_s=timeout_s)
        if problem is not None:
            attempt.fatal = attempt.fatal or problem.fatal
            attempt.failures.append(WorkerFailure(rank=problem.rank, summary=problem.summary,
                                                  traceback=""))

    def _drain_inbox(self) -> None:
        attempt = self.attempt
        while (item := self._parts.inbox.next_item()) is not None:
            if isinstance(item, NewConnection):
                if item.attempt != attempt.number or item.rank in attempt.connected:
                    item.connection.close()  # a straggler of a previous attempt
                    continue
                attempt.connections[item.rank] = item.connection
                attempt.connected.add(item.rank)
                # Registrations first: the setup holds locations that only resolve once
                # the worker knows the run's custom schemes.
                self._send(item.rank, ("registrations", self._registrations))
                self._send(item.rank, self._setup_message(attempt, item.rank))
                if self.preemption.info is not None:  # a notice came before it connected
                    self._send(item.rank, PreemptionMessage(self.preemption.info))
                if self.all_connected:
                    self._parts.events.emit(WorkersReady(t=self._clock.time(),
                                                         attempt=attempt.number))
            elif isinstance(item, CommitResult):
                self.on_committed(item)

    def on_committed(self, result: CommitResult) -> None:
        attempt, parts = self.attempt, self._parts
        parts.commits.on_committed(attempt, result)
        attempt.tracker.on_committed(result.ready.index)
        parts.validations.after_commit(result.ready, committed=result.error is None)
        self._services.answer(attempt.tracker, self._send)

    def stop_ranks(self, ranks: set[int], reason: str, timeout_s: float) -> bool:
        """Stop the train functions of ``ranks`` (kept after another rank failed) and wait
        until each says it is idle, or went (exited, lost its connection, returned):
        False when one has done neither within ``timeout_s``. Which of them can be kept is
        the caller's to decide again (:attr:`stopped`, the failures that came meanwhile).

        Their messages meanwhile are handled as usual: a report the failed rank had
        reached may still commit."""
        attempt, clock = self.attempt, self._clock
        for rank in sorted(ranks):
            self._send(rank, StopMessage(attempt.number, reason))
        deadline = clock.monotonic() + timeout_s
        while True:
            waiting = {r for r in ranks - self.stopped - self.exited - set(attempt.done)
                       if r in attempt.connections}
            now = clock.monotonic()
            # A kept rank whose connection ended: its exit is awaited (as by turn()), to
            # say how it ended, whichever of the two came first.
            awaited = attempt.exit_awaited_until(now)
            if awaited is None and (not waiting or len(
                    {f.rank for f in attempt.failures if cause_order(f) == 0}) > 1):
                # All stopped or went; or a second cause (a kept rank went, or raised its
                # own error): the whole group restarts and the others need not stop. A
                # kept rank's collective that lost the failed peer is no cause: it still
                # stops, and is kept.
                return True
            if waiting and now >= deadline:
                logger.warning("%s did not stop within %gs", describe_ranks(sorted(waiting)),
                               timeout_s)
                return False
            watchers = {w.exit_watcher.fileno(): w for w in attempt.workers
                        if w.rank in ranks and w.rank not in self.exited}
            ready = self._wait_and_read(watchers, max(0.0, min(
                1.0, deadline - now, awaited - now if awaited is not None else 1.0)))
            self._on_exits([watchers[item] for item in ready
                            if isinstance(item, int) and item in watchers])

    def _wait_and_read(self, watchers: Collection[int], timeout_s: float) -> list[Any]:
        """Wait up to ``timeout_s`` for a message, the inbox or the exit of one of
        ``watchers`` (their exit watchers' file descriptors); handle the inbox and the
        messages that arrived, and return what was ready (the exits are the caller's)."""
        connections = {c: r for r, c in self.attempt.connections.items()}
        wake_r = self._parts.inbox.wake_r
        ready = self._clock.wait([wake_r, *connections, *watchers], timeout_s)
        if wake_r in ready:
            self._parts.inbox.clear_wake()
        self._drain_inbox()
        for item in ready:
            if item in connections:
                self._read_connection(connections[item], item)
        return list(ready)

    def wait_for_commits(self) -> None:
        """Wait for the commits in flight (the attempt's workers are gone)."""
        inbox = self._parts.inbox
        while self.attempt.commits_in_flight > 0:
            self._clock.wait([inbox.wake_r], 1.0)
            inbox.clear_wake()
            while (item := inbox.next_item()) is not None:
                if isinstance(item, CommitResult):
                    self.on_committed(item)
                elif isinstance(item, NewConnection):
                    item.connection.close()

    def _on_exits(self, gone: list[WorkerHandle]) -> None:
        """Workers ended: each that did not finish or fail on its own went."""
        attempt = self.attempt
        self.exited.update(w.rank for w in gone)
        # Messages sent just before the exits are already in the sockets: read them first,
        # so a Done or an error is never mistaken for a crash.
        self._parts.channels.read_last_messages(attempt, gone, self._clock, self._handle)
        attempt.exits_seen(gone)
        for worker in gone:
            self._check_preempted(worker.rank)
            if attempt.went_unexplained(worker.rank):
                attempt.failures.append(describe_lost(worker, True))

    def read_waiting(self) -> None:
        """Handle what every connection has waiting now, without waiting for more."""
        for rank, connection in list(self.attempt.connections.items()):
            self._read_connection(rank, connection)

    def _read_connection(self, rank: int, connection: Connection, *,
                         everything: bool = False) -> None:
        self._parts.channels.read(self.attempt, rank, connection, self._handle,
                                  self._clock.monotonic(), everything=everything)
        if rank not in self.attempt.connections:  # it ended: the rank went
            self._check_preempted(rank)

    def _check_preempted(self, rank: int) -> None:
        """A rank went: on Ray, lost with a preempted node (a notice of its own), whether
        its exit or the end of its connection came first."""
        worker = next(w for w in self.attempt.workers if w.rank == rank)
        if worker.preempted:
            self._on_preemption_notice(PreemptionNoticeMessage(
                rank, None, PREEMPTED_SOURCE))

    def _handle(self, message: object) -> None:
        try:
            self._dispatch(message)
        except (StorageError, OSError) as exc:  # the driver's own: the rank's connection is fine
            driver_failure(self.attempt, message, exc)

    def _dispatch(self, message: object) -> None:
        attempt, parts = self.attempt, self._parts
        if isinstance(message, ReportMessage):
            self._on_report(message)
        elif isinstance(message, UploadedMessage):
            parts.events.emit(Uploaded(message))
            if message.index in attempt.skipped_dirs:
                # Another rank's upload failed and the report was dropped: this late part
                # is removed too.
                self._delete_uncommitted(attempt.skipped_dirs[message.index])
                return
            self._send_verdicts(attempt.tracker.on_uploaded(message))
            self._enqueue_ready()
        elif isinstance(message, TimingMessage) and message.kind == "train_start":
            attempt.started_ranks.add(message.rank)
            if not attempt.train_started:
                attempt.train_started = True
                parts.events.emit(TrainStart(t=message.at, attempt=attempt.number))
        elif isinstance(message, TimingMessage):
            parts.events.emit(Blocked(t=message.at, rank=message.rank, kind=message.kind,
                                      seconds=message.seconds, index=message.index))
        elif isinstance(message, UploadFailedMessage):
            self._on_upload_failed(message)
        elif isinstance(message, DoneMessage):
            again, attempt.done[message.rank] = message.rank in attempt.done, message
            if not again and len(attempt.done) == len(attempt.workers):  # all returned
                parts.events.emit(TrainEnd(t=self._clock.time(), attempt=attempt.number))
        elif isinstance(message, StoppedMessage):
            if message.attempt == attempt.number:
                self.stopped.add(message.rank)
                self.copies[message.rank] = message.memory_copy
        elif isinstance(message, PreemptionNoticeMessage):
            self._on_preemption_notice(message)
        elif isinstance(message, RestoredMessage):
            parts.events.emit(Restored(
                t=parts.clock.time(), rank=message.rank, kind=message.source,
                index=message.report_index, peer=message.peer_rank,
                memory_bytes=message.memory_bytes, peer_bytes=message.peer_bytes,
                driver_bytes=message.driver_bytes, bytes=message.storage_bytes,
                seconds=message.seconds, reason=message.reason,
                prefetched=message.prefetched))
        elif self._services.handle(message, attempt.tracker, self._send):
            pass  # a collective call or a get_all_reported_checkpoints() request
        elif isinstance(message, ErrorMessage):
            attempt.fatal = attempt.fatal or message.fatal
            attempt.failures.append(WorkerFailure(
                rank=message.rank, summary=f"{message.error_type}: {message.message}",
                traceback=message.traceback, exception=message.exception,
                frame=message.frame,
            ))

    def note_preempted(self, failure: AttemptFailure) -> None:
        """The ranks that ended the attempt were killed and their ends waited for: one whose
        connection ended before Ray said its actor was lost with a preempted node (the flag
        comes with the actor's death) is noticed now, so its node's other ranks are not
        kept. Not sent to the ranks: the attempt is over, kept ranks wait for the next."""
        for went in [f for f in self.attempt.failures if f.went and f.rank in failure.ranks]:
            worker = next(w for w in self.attempt.workers if w.rank == went.rank)
            if worker.preempted:
                self._on_preemption_notice(PreemptionNoticeMessage(
                    went.rank, None, PREEMPTED_SOURCE), tell_ranks=False)

    def preemption_after_stop(self, failure: AttemptFailure) -> AttemptFailure:
        """After the stop (:meth:`note_preempted`): the failure is the preemption it was when
        a rank that ended the attempt went from a preempted node. Only those ranks count:
        not a noticed rank the controller itself killed to replace it."""
        if failure.preemption is not None or failure.fatal:
            return failure
        self.note_preempted(failure)
        if not self.preemption.caused(f for f in self.attempt.failures
                                      if f.rank in failure.ranks):
            return failure
        return dataclasses.replace(failure, preemption=self.preemption.info)

    def _on_preemption_notice(self, message: PreemptionNoticeMessage, *,
                              tell_ranks: bool = True) -> None:
        info = self.preemption.on_notice(message)
        if info is None:
            return
        if tell_ranks:
            # Every rank learns it, so that get_preemption_info() agrees on every rank.
            self._parts.channels.broadcast(self.attempt, PreemptionMessage(info))
        self._parts.events.emit(PreemptionNotice(
            t=self._clock.time(), attempt=self.attempt.number,
            ranks=tuple(info.preempted_ranks), nodes=tuple(info.preempted_node_ids),
            deadline_t=self.preemption.deadline_t(), source=message.source))
        self._parts.events.emit(Notice(
            f"preemption notice ({message.source}): ranks "
            f"{', '.join(map(str, info.preempted_ranks))} on nodes "
            f"{', '.join(n[:12] for n in info.preempted_node_ids)} are about to go; once a "
            f"worker goes, or at the deadline ({self.preemption.describe_deadline()}), the "
            "run restarts from its latest checkpoint, counted against "
            "max_preemption_failures"))
        self.flush_logs()

    def _send(self, rank: int, message: object) -> None:
        self._parts.channels.send(self.attempt, rank, message)

    def _delete_uncommitted(self, dir_name: str) -> None:
        # Queued to the commit thread, the checkpoint manager's one owner.
        manager = self._parts.manager
        self._parts.commits.run_on_commit_thread(
            lambda: manager.delete_uncommitted([dir_name]))

    def flush_logs(self) -> None:
        """Persist the metrics history and event log; a storage error is logged, not fatal
        (the records stay buffered and go out with the next flush)."""
        for log in (self._parts.history, self._parts.event_log):
            if not log.dirty:
                continue
            try:
                log.flush()
            except Exception:
                logger.warning("Could not write a run log; retrying with the next flush",
                               exc_info=True)

    def _on_report(self, message: ReportMessage) -> None:
        attempt, parts = self.attempt, self._parts
        self._progress.next_report_index = max(self._progress.next_report_index,
                                               message.index + 1)
        if not attempt.first_report_seen:
            attempt.first_report_seen = True
            parts.events.emit(FirstReport(t=self._clock.time(), attempt=attempt.number))
            # FailureConfig(warm_standby=True): spares for the next attempt start once this
            # one trains, so that their start-up does not slow this attempt's own.
            parts.backend.prepare_standby()
        if message.rank == 0:
            self._progress.last_metrics = message.metrics
            self._progress.last_report_index = message.index
        # The metrics history (rank 0's), the live view and the callbacks follow it.
        parts.events.emit(Reported(attempt.number, message))
        self._send_verdicts(attempt.tracker.on_report(message))
        self._enqueue_ready()

    def _send_verdicts(self, verdicts: list[Verdict]) -> None:
        attempt = self.attempt
        announce = {(v.announce, v.index) for v in verdicts
                    if v.error is None and v.announce is not None}
        for dir_name, index in sorted(announce):
            if dir_name in attempt.announced_dirs:
                continue
            # Written before the upload starts: a driver that dies mid-upload leaves a
            # directory the next driver knows it may delete.
            attempt.announced_dirs.add(dir_name)
            self._parts.events.emit(CheckpointStarted(t=self._clock.time(), dir_name=dir_name,
                                                      index=index))
        if announce:
            self.flush_logs()
        for verdict in verdicts:
            reply = (ProceedMessage(verdict.index, verdict.duplicates, verdict.shared,
                                    verdict.stale) if verdict.error is None
                     else RejectMessage(verdict.index, verdict.error))
            self._send(verdict.rank, reply)

    def _enqueue_ready(self) -> None:
        attempt = self.attempt
        try:
            ready_list = attempt.tracker.take_ready()
        except ReportError as exc:
            attempt.fatal = True
            attempt.failures.append(WorkerFailure(rank=0, summary=str(exc), traceback=""))
            return
        # Ranks that uploaded different copies of one path: that report is refused.
        self._send_verdicts(attempt.tracker.take_refused())
        for vanished in attempt.tracker.take_vanished():
            if vanished.fatal is not None:
                self._handle(vanished.fatal)
            self._on_upload_failed(vanished.failed)
        for ready in ready_list:
            try:
                self._parts.validations.before_commit(ready)
            except StorageError as exc:
                not_handed_to_commit(attempt, ready, exc)
                continue
            self._parts.commits.submit(attempt, ready)

    def _on_upload_failed(self, message: UploadFailedMessage) -> None:
        upload_failed(self.attempt, self._parts, message, send_verdicts=self._send_verdicts,
                      delete=self._delete_uncommitted)
