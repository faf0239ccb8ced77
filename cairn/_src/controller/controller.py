"""The controller: runs attempts of a worker group until the run finishes or fails.

It lives in the driver process. One thread (the caller of ``fit()``) runs an event loop
that waits, without polling, on the workers' connections, on their exit notifications and
on a wake-up pipe fed by two helper threads: the acceptor (authenticated connections of
new workers, :mod:`connections`) and the committer (checkpoint commits, in report order,
off the loop so storage latency never delays another rank's message,
:mod:`commit_pipeline`). Every state change goes through the one :class:`StateMachine`.

When a rank fails, the surviving ranks get a short, bounded grace (``_REPORT_GRACE_S``) to
finish the reports up to the failed rank's last report; those are committed, then the
attempt is torn down and restarted (:meth:`Controller._reports_still_coming`). A fatal
failure, or a lost lease, ends the attempt at once.

Policies decide (retention, failures), the controller acts.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

import cloudpickle

from cairn._src.backends.factory import make_backend
from cairn._src.checkpoint.manager import CheckpointManager
from cairn._src.checkpoint.views import ReadyCheckpoint
from cairn._src.config.run import RunConfig, ScalingConfig
from cairn._src.controller.attempt import Attempt, placement
from cairn._src.controller.commit_pipeline import CommitPipeline
from cairn._src.controller.connections import WorkerChannels
from cairn._src.controller.failure_errors import error_summary, failure_records, worker_group_error
from cairn._src.controller.failure_policy import AttemptFailure, FailureDecision, FailurePolicy
from cairn._src.controller.progress import check_progress
from cairn._src.controller.reports import ReportTracker, Verdict, describe_ranks
from cairn._src.controller.services import AttemptServices
from cairn._src.controller.state import ControllerState, StateMachine
from cairn._src.controller.validations import ValidationRunner
from cairn._src.controller.worker_failures import WorkerFailure, group_failures, ordered_ranks
from cairn._src.errors import (
    CheckpointDamagedError,
    ConfigError,
    ReportError,
    WorkerGroupError,
)
from cairn._src.observe.callbacks import CallbackDispatcher, TrainRunContext
from cairn._src.observe.live_state import give_up_notice, start_notice
from cairn._src.observe.live_view import LiveView
from cairn._src.run.layout import EVENTS_DIR
from cairn._src.run.segment_log import SegmentLog, read_log
from cairn._src.run.status import run_history
from cairn._src.run.storage_check import remove_storage_marker, write_storage_marker
from cairn._src.storage.registry import export_registrations
from cairn._src.wire.bootstrap import Bootstrap
from cairn._src.wire.channel_security import tls_enabled
from cairn._src.wire.code_locations import dumps_with_locations
from cairn._src.wire.datasets import DatasetSplit, split_datasets
from cairn._src.wire.messages import (
    CommittedMessage,
    DoneMessage,
    ErrorMessage,
    ProceedMessage,
    RejectMessage,
    ReportMessage,
    SetupMessage,
    TimingMessage,
    UploadedMessage,
    UploadFailedMessage,
)

logger = logging.getLogger(__name__)

# How long to wait, after the first failure of an attempt, for other ranks' errors to
# arrive so they are reported together.
_FAILURE_GRACE_S = 0.2
# How long, after a rank failed, the surviving ranks may take to finish the reports up to
# the failed rank's last report, so that those are committed before the teardown.
_REPORT_GRACE_S = 10.0
_HISTORY_FLUSH_S = 1.0
_LAST_MESSAGE_GRACE_S = 2.0
# Workers that have not connected by then are reported (a node that cannot reach the
# controller, an interpreter that hangs while importing).
_WORKER_START_TIMEOUT_S = 300.0


@dataclass
class TrainSpec:
    train_fn: Callable[..., Any]
    config: Any
    pass_config: bool
    setup_hooks: list[Callable[[Any], None]] = field(default_factory=list)
    teardown_hooks: list[Callable[[Any], None]] = field(default_factory=list)
    # Called in the driver before each attempt: extra environment for its workers (for
    # example a fresh rendezvous port for torch.distributed).
    attempt_env: Callable[[int], dict[str, str]] | None = None
    # Trainer(validation_config=...): a cairn.ValidationConfig, or None.
    validation_config: Any = None
    # Trainer(datasets=...): Ray Data datasets by name, split at each attempt's start.
    datasets: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunOutcome:
    return_value: Any = None
    error: BaseException | None = None
    last_metrics: dict[str, Any] = field(default_factory=dict)


def _pickle_registrations() -> bytes:
    registrations = export_registrations()
    for scheme, factory in registrations.items():
        try:
            cloudpickle.dumps(factory)
        except Exception as exc:
            raise ConfigError(
                f"The storage factory registered for scheme {scheme!r} cannot be pickled "
                f"({type(exc).__name__}: {exc}), so worker processes cannot reach the store. "
                "Register a function defined in an importable module, keep no open "
                "connections or locks in the factory's closure, or register the store "
                "through the 'cairn.storage' entry point."
            ) from exc
    return bytes(cloudpickle.dumps(registrations))


class Controller:
    def __init__(
        self,
        spec: TrainSpec,
        scaling: ScalingConfig,
        run_config: RunConfig,
        manager: CheckpointManager,
        history: SegmentLog,
        events: SegmentLog,
        *,
        experiment_name: str,
        next_report_index: int,
    ) -> None:
        self._spec = spec
        self._scaling = scaling
        self._run_config = run_config
        self._manager = manager
        self._history = history
        self._events = events
        self._experiment_name = experiment_name
        self._next_report_index = next_report_index
        self._policy = FailurePolicy(run_config.failure_config.max_failures)
        # The driver's live view (RunConfig.progress); its hooks never block this thread.
        self._view = LiveView.for_run(run_config, scaling.max_workers)
        self._machine = StateMachine()
        self._backend = make_backend(scaling, run_config)
        # The driver node's address, never every interface (loopback for local workers).
        self._channels = WorkerChannels(self._backend.advertise_host(),
                                        tls=tls_enabled(scaling.tls))
        self._storage_token: str | None = None
        self._dataset_split: DatasetSplit | None = None
        self._callbacks = CallbackDispatcher(
            run_config.callbacks,
            TrainRunContext(run_config=run_config, train_loop_config=spec.config,
                            scaling_config=scaling),
            scaling.max_workers,
        )
        self._commits = CommitPipeline(manager, events, run_config, self._channels.post,
                                       self._channels.broadcast, callbacks=self._callbacks)
        self._validations = ValidationRunner(
            spec.validation_config, manager, events, submit=self._commits.run_on_commit_thread,
            wake=lambda: self._channels.post("validated", None))
        earlier_events = read_log(manager.run.join(EVENTS_DIR), manager.retry)
        self._validations.resume(earlier_events)
        self._view.follow(earlier_events, self._validations.status)
        self._finished_before = run_history(earlier_events).status == "finished"
        self._attempts_this_session = 0
        self._services: AttemptServices | None = None
        self._last_metrics: dict[str, Any] = {}
        self._last_error: dict[str, Any] | None = None
        self._payload = (
            # File names and line numbers of the user's code survive the trip, for the
            # tracebacks of failed ranks (code_locations).
            dumps_with_locations(spec.train_fn),
            cloudpickle.dumps(spec.config),
            _pickle_registrations(),
            cloudpickle.dumps(run_config.storage_retry),
            cloudpickle.dumps(spec.setup_hooks),
            cloudpickle.dumps(spec.teardown_hooks),
        )

    @property
    def state(self) -> ControllerState:
        return self._machine.state

    # --- the run -------------------------------------------------------------------------

    def run(self) -> RunOutcome:
        self._channels.start()
        self._commits.start()
        self._events.append({"type": "session_start", "t": time.time()})
        self._view.start()
        # How the session ended, for `cairn ls` and Result.from_path: "finished", "failed"
        # (with the error), or "interrupted" (Ctrl-C, or the driver itself broke).
        end: dict[str, Any] = {"status": "interrupted"}
        try:
            # Every worker reads it back before training: storage a node cannot see fails
            # the run at once.
            self._storage_token = write_storage_marker(self._manager.run, self._manager.retry)
            outcome = self._run_attempts()
            end = ({"status": "finished"} if outcome.error is None
                   else {"status": "failed", "error": self._last_error})
            return outcome
        except BaseException as exc:
            if not isinstance(exc, KeyboardInterrupt):
                end = {"status": "failed", "error": error_summary(exc, ranks=())}
            raise
        finally:
            try:
                self._close(end)
            finally:
                # Also on Ctrl-C or a broken driver: the terminal is left as it was.
                self._view.stop()

    def _run_attempts(self) -> RunOutcome:
        while True:
            self._machine.transition(ControllerState.STARTING, "starting a worker group")
            attempt = self._start_attempt()
            failure = self._loop(attempt)
            if failure is None:
                self._machine.transition(ControllerState.FINISHING, "all workers finished")
                outcome = self._finish(attempt)
                self._machine.transition(ControllerState.FINISHED, "run complete")
                return outcome
            error = self._end_failed_attempt(attempt, failure)
            if attempt.resume_damaged:
                logger.warning(
                    "Attempt %d: a rank found the checkpoint it resumed from, %s, damaged "
                    "(%s). The next attempt verifies it in full and, if it is damaged, falls "
                    "back to the previous committed checkpoint on every rank; this does not "
                    "count as a failure.", attempt.number,
                    attempt.resume.dir_name if attempt.resume else "-",
                    failure.reason.splitlines()[0])
                self._machine.transition(ControllerState.RESTARTING,
                                         "the resume checkpoint is damaged")
                continue
            failures = self._manager.index.failures
            decision = self._policy.decide(failure, failures - 1)
            logger.warning("Attempt %d failed (%s); failure %d of %s allowed: %s", attempt.number,
                           failure.reason.splitlines()[0], failures,
                           "unlimited" if self._policy.max_failures == -1
                           else self._policy.max_failures, decision.value)
            if decision is FailureDecision.RAISE:
                latest = self._manager.index.latest
                self._view.notice(give_up_notice(
                    self._experiment_name, attempt=attempt.number,
                    max_failures=self._policy.max_failures, fatal=failure.fatal,
                    latest=latest.dir_name if latest is not None else None))
                self._machine.transition(ControllerState.ERRORED, "failure budget spent"
                                         if not failure.fatal else "fatal error")
                return RunOutcome(error=error, last_metrics=self._last_metrics)
            self._machine.transition(ControllerState.RESTARTING, failure.reason.splitlines()[0])

    def _start_attempt(self) -> Attempt:
        # On the commit thread, after the deletions it still has queued, and outside the
        # pause below: a validation result waiting there takes the same lock.
        self._commits.call_on_commit_thread(self._manager.retry_deletions)
        with self._validations.paused():
            index = self._manager.index
            number = index.attempts
            # A commit whose index write failed after its manifest landed is settled
            # first (committed: adopted), so this attempt resumes from it consistently.
            self._manager.settle_uncertain()
            resume = self._manager.choose_resume()
            self._manager.save_index(
                attempts=number + 1,
                resumed_from=resume.dir_name if resume else None,
                next_report_index=self._next_report_index,
            )
        # Names of committed checkpoints, and of run-directory entries holding the data
        # of checkpoints committed by reference: an upload there would overwrite them.
        used = {r.dir_name for r in self._manager.index.checkpoints}
        used |= self._manager.names_holding_references()
        attempt = Attempt(
            number=number,
            tracker=ReportTracker(self._scaling.max_workers, used_dir_names=used),
            resume=resume,
            first_report_index=self._next_report_index,
            started_at=time.time(),
        )
        self._events.append({"type": "attempt_start", "attempt": number, "t": attempt.started_at,
                             "resume": resume.dir_name if resume else None})
        self._events.flush()
        if self._attempts_this_session == 0:
            self._view.notice(start_notice(
                self._experiment_name, self._manager.run.display(), attempts=number,
                checkpoints=len(self._manager.index.checkpoints),
                resume=resume.dir_name if resume else None,
                resume_report=resume.report_index if resume else None,
                finished_before=self._finished_before))
        self._attempts_this_session += 1
        self._view.on_attempt_start(number, attempt.started_at,
                                    resume.dir_name if resume else None)
        port = self._channels.port
        env = self._spec.attempt_env(number) if self._spec.attempt_env else {}
        bootstrap = Bootstrap((self._backend.advertise_host(), port), self._channels.authkey,
                              number, tls_certificate=self._channels.certificate_pem)
        attempt.workers = self._backend.start(self._scaling.max_workers, bootstrap, env=env)
        # The world of this attempt is the group the backend started: an elastic range
        # (ScalingConfig.min_workers .. max_workers) may get fewer than it asked for.
        world_size = len(attempt.workers)
        attempt.tracker = ReportTracker(world_size, used_dir_names=used)
        self._services = AttemptServices(world_size, self._manager, self._validations,
                                         self._run_config.checkpoint_config)
        self._callbacks.set_world_size(world_size)
        logger.info("Attempt %d: %d workers, resuming from %s", number, world_size,
                    resume.dir_name if resume else "scratch")
        # One shard per worker of this attempt, produced near it (train/datasets.py).
        self._dataset_split = split_datasets(
            self._spec.datasets, [w.node_id for w in attempt.workers]
        ) if self._spec.datasets else None
        return attempt

    def _setup_message(self, attempt: Attempt, rank: int) -> SetupMessage:
        train_fn, config, _, retry, hooks, teardown = self._payload
        checkpoint_config = self._run_config.checkpoint_config
        local_rank, local_world_size, node_rank = placement(attempt.workers)[rank]
        return SetupMessage(
            rank=rank,
            world_size=len(attempt.workers),
            local_rank=local_rank,
            local_world_size=local_world_size,
            node_rank=node_rank,
            attempt=attempt.number,
            experiment_name=self._experiment_name,
            run=self._manager.run,
            train_fn=train_fn,
            config=config,
            pass_config=self._spec.pass_config,
            resume=attempt.resume,
            first_report_index=attempt.first_report_index,
            score_attribute=checkpoint_config.checkpoint_score_attribute,
            max_pending_uploads=checkpoint_config.max_pending_uploads,
            upload_failure_policy=checkpoint_config.upload_failure_policy,
            retry=retry,
            transfer=self._run_config.storage_transfer,
            setup_hooks=hooks,
            teardown_hooks=teardown,
            validation=self._spec.validation_config is not None,
            storage_token=self._storage_token,
            dataset_names=tuple(self._spec.datasets),
            dataset_shards=(self._dataset_split.payloads[rank] if self._dataset_split
                            else None),
            local_tier_bytes=checkpoint_config.local_tier_bytes,
            local_tier_dir=checkpoint_config.local_tier_dir,
        )

    # --- the event loop ------------------------------------------------------------------

    def _loop(self, attempt: Attempt) -> AttemptFailure | None:
        timeout_s = self._run_config.failure_config.collective_timeout_s
        exited: set[int] = set()
        failure_deadline: float | None = None
        report_deadline: float | None = None
        next_flush = time.monotonic() + _HISTORY_FLUSH_S
        while True:
            watchers = {w.exit_watcher.fileno(): w for w in attempt.workers if w.rank not in exited}
            connections = {c: r for r, c in attempt.connections.items()}
            now = time.monotonic()
            # A failure deadline already past while the report grace runs: wait for
            # messages, exits or the grace's own deadline instead of spinning.
            upcoming = [d for d in (failure_deadline, report_deadline) if d is not None and d > now]
            deadline = min([*upcoming, next_flush, now + 1.0])
            wake_r = self._channels.wake_r
            ready = wait([wake_r, *connections, *watchers], max(0.0, deadline - now))
            if wake_r in ready:
                os.read(wake_r, 4096)
            self._drain_inbox(attempt)
            for item in ready:
                if item in connections:
                    self._read_connection(attempt, connections[item], item)
            for item in ready:
                worker = watchers.get(item) if isinstance(item, int) else None
                if worker is None:
                    continue
                exited.add(worker.rank)
                # Messages sent just before the exit are already in the socket: read them
                # first, so a Done or an error is never mistaken for a crash.
                connection = attempt.connections.get(worker.rank)
                if connection is not None:
                    # An exit can be reported before the worker's last message is readable
                    # (Ray reports a finished actor task through its own channel).
                    connection.poll(_LAST_MESSAGE_GRACE_S)
                    self._read_connection(attempt, worker.rank, connection, everything=True)
                if worker.rank not in attempt.done and not any(
                    f.rank == worker.rank for f in attempt.failures
                ):
                    attempt.failures.append(WorkerFailure(
                        rank=worker.rank,
                        summary=f"Worker rank {worker.rank} (pid {worker.pid}) "
                        f"{worker.describe_exit()}",
                        traceback="",
                    ))
            if time.monotonic() >= next_flush:
                self._flush_logs()
                next_flush = time.monotonic() + _HISTORY_FLUSH_S
            if not attempt.failures:
                self._check_progress(attempt, timeout_s)
                self._check_started(attempt)
            if attempt.failures:
                if failure_deadline is None:
                    failure_deadline = time.monotonic() + _FAILURE_GRACE_S
                    if not attempt.fatal:
                        report_deadline = time.monotonic() + _REPORT_GRACE_S
                if (report_deadline is not None and time.monotonic() < report_deadline
                        and self._reports_still_coming(attempt, exited)):
                    continue
                if time.monotonic() >= failure_deadline or len(exited) == len(attempt.workers):
                    return AttemptFailure(
                        # The rank that caused the failure first (a killed rank before
                        # the ranks whose collective then lost it).
                        ranks=tuple(ordered_ranks(attempt.failures)),
                        reason=group_failures(attempt.failures),
                        fatal=attempt.fatal,
                    )
                continue
            if len(attempt.done) == len(attempt.workers) and attempt.commits_in_flight == 0:
                return None

    def _reports_still_coming(self, attempt: Attempt, exited: set[int]) -> bool:
        """Whether surviving ranks may still complete reports the failed ranks reached.

        A rank that fails must not cost the others the reports it already passed: until
        every report up to the failed ranks' last one is resolved (committed, skipped or
        refused), and while a rank that has not failed still runs, the attempt waits (at
        most ``_REPORT_GRACE_S``), then tears down and restarts. Ray Train's report() is a
        barrier, so there these reports commit too.
        """
        failed = {f.rank for f in attempt.failures}
        target = max((attempt.tracker.last_index.get(rank, 0) for rank in failed), default=0)
        if target < attempt.first_report_index:
            return False
        surviving = {w.rank for w in attempt.workers} - exited - failed - set(attempt.done)
        if not surviving or not all(rank in attempt.connections for rank in surviving):
            return False
        return bool(attempt.tracker.unresolved_before(target)) or attempt.commits_in_flight > 0

    def _check_started(self, attempt: Attempt) -> None:
        if len(attempt.connected) == len(attempt.workers):
            return
        if time.time() - attempt.started_at > _WORKER_START_TIMEOUT_S:
            missing = sorted({w.rank for w in attempt.workers} - attempt.connected)
            attempt.failures.append(WorkerFailure(
                rank=missing[0], traceback="",
                summary=f"{describe_ranks(missing)} did not connect to the controller within "
                f"{_WORKER_START_TIMEOUT_S:g}s of starting"))

    def _check_progress(self, attempt: Attempt, timeout_s: float) -> None:
        if self._services is not None:
            # Collectives and get_all_reported_checkpoints(): answer what can be answered
            # (timeouts included), then look for calls that never can be.
            self._services.answer(attempt.tracker, lambda r, m: self._send(attempt, r, m))
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

    def _drain_inbox(self, attempt: Attempt) -> None:
        while (item := self._channels.next_item()) is not None:
            kind, payload = item
            if kind == "connection":
                connection, hello = payload
                _, rank, _pid, number = hello
                if number != attempt.number or rank in attempt.connected:
                    connection.close()  # a straggler of a previous attempt
                    continue
                attempt.connections[rank] = connection
                attempt.connected.add(rank)
                # Registrations first: the setup holds locations that only resolve once the
                # worker knows the run's custom schemes.
                self._send(attempt, rank, ("registrations", self._payload[2]))
                self._send(attempt, rank, self._setup_message(attempt, rank))
                if len(attempt.connected) == len(attempt.workers):
                    self._machine.transition(ControllerState.RUNNING, "all workers connected")
                    self._events.append({"type": "workers_ready", "attempt": attempt.number,
                                         "t": time.time()})
            elif kind == "committed":
                self._on_committed(attempt, *payload)

    def _on_committed(self, attempt: Attempt, ready: ReadyCheckpoint, outcome: Any,
                      error: BaseException | None) -> None:
        self._commits.on_committed(attempt, ready, outcome, error)
        self._view.on_committed(ready, outcome, error)
        attempt.tracker.on_committed(ready.index)
        self._validations.after_commit(ready, committed=error is None)
        if self._services is not None:
            self._services.answer(attempt.tracker, lambda r, m: self._send(attempt, r, m))

    def _read_connection(self, attempt: Attempt, rank: int, connection: Connection, *,
                         everything: bool = False) -> None:
        self._channels.read(attempt, rank, connection,
                            lambda message: self._handle(attempt, message), everything=everything)

    def _handle(self, attempt: Attempt, message: object) -> None:
        self._view.on_message(message)
        if isinstance(message, ReportMessage):
            self._on_report(attempt, message)
        elif isinstance(message, UploadedMessage):
            if message.index in attempt.skipped_dirs:
                # Another rank's upload failed and the report was dropped: this late part
                # is removed too.
                self._manager.delete_uncommitted([attempt.skipped_dirs[message.index]])
                return
            self._send_verdicts(attempt, attempt.tracker.on_uploaded(message))
            self._enqueue_ready(attempt)
        elif isinstance(message, TimingMessage) and message.kind == "train_start":
            if not attempt.train_started:
                attempt.train_started = True
                self._events.append({"type": "train_start", "attempt": attempt.number,
                                     "t": message.at})
        elif isinstance(message, TimingMessage):
            self._events.append({"type": "blocked", "rank": message.rank, "kind": message.kind,
                                 "seconds": message.seconds, "t": message.at,
                                 "index": message.index})
        elif isinstance(message, UploadFailedMessage):
            self._on_upload_failed(attempt, message)
        elif isinstance(message, DoneMessage):
            attempt.done[message.rank] = message
        elif self._services is not None and self._services.handle(
                message, attempt.tracker, lambda r, m: self._send(attempt, r, m)):
            pass  # a collective call or a get_all_reported_checkpoints() request
        elif isinstance(message, ErrorMessage):
            attempt.fatal = attempt.fatal or message.fatal
            attempt.failures.append(WorkerFailure(
                rank=message.rank, summary=f"{message.error_type}: {message.message}",
                traceback=message.traceback, exception=message.exception,
                frame=message.frame,
            ))

    def _send(self, attempt: Attempt, rank: int, message: object) -> None:
        self._channels.send(attempt, rank, message)

    def _broadcast(self, attempt: Attempt, message: object) -> None:
        self._channels.broadcast(attempt, message)

    def _flush_logs(self) -> None:
        """Persist the metrics history and event log; a storage error is logged, not fatal
        (the records stay buffered and go out with the next flush)."""
        for log in (self._history, self._events):
            if not log.dirty:
                continue
            try:
                log.flush()
            except Exception:
                logger.warning("Could not write a run log; retrying with the next flush",
                               exc_info=True)

    def _on_report(self, attempt: Attempt, message: ReportMessage) -> None:
        self._next_report_index = max(self._next_report_index, message.index + 1)
        if not attempt.first_report_seen:
            attempt.first_report_seen = True
            self._events.append({"type": "first_report", "attempt": attempt.number,
                                 "t": time.time()})
            # FailureConfig(warm_standby=True): spares for the next attempt start once this
            # one trains, so that their start-up does not slow this attempt's own.
            prepare_standby = getattr(self._backend, "prepare_standby", None)
            if prepare_standby is not None:
                prepare_standby()
        if message.rank == 0:
            self._last_metrics = message.metrics
            record: dict[str, Any] = {"report_index": message.index, "attempt": attempt.number,
                                      "time": message.sent_at, "metrics": message.metrics}
            if message.checkpoint is not None:
                record["checkpoint_dir_name"] = message.checkpoint.dir_name
            self._history.append(record)
        self._callbacks.reported(message.rank, message.index, message.metrics,
                                 message.checkpoint is not None)
        self._send_verdicts(attempt, attempt.tracker.on_report(message))
        self._enqueue_ready(attempt)

    def _send_verdicts(self, attempt: Attempt, verdicts: list[Verdict]) -> None:
        announce = {(v.announce, v.index) for v in verdicts
                    if v.error is None and v.announce is not None}
        for dir_name, index in sorted(announce):
            if dir_name in attempt.announced_dirs:
                continue
            # Written before the upload starts: a driver that dies mid-upload leaves a
            # directory the next driver knows it may delete.
            attempt.announced_dirs.add(dir_name)
            self._events.append({"type": "checkpoint_started", "dir_name": dir_name,
                                 "index": index, "t": time.time()})
        if announce:
            self._flush_logs()
        for verdict in verdicts:
            reply = (ProceedMessage(verdict.index, verdict.duplicates, verdict.shared,
                                    verdict.stale) if verdict.error is None
                     else RejectMessage(verdict.index, verdict.error))
            self._send(attempt, verdict.rank, reply)

    def _enqueue_ready(self, attempt: Attempt) -> None:
        try:
            ready_list = attempt.tracker.take_ready()
        except ReportError as exc:
            attempt.fatal = True
            attempt.failures.append(WorkerFailure(rank=0, summary=str(exc), traceback=""))
            return
        # Ranks that uploaded different copies of one path: that report is refused.
        self._send_verdicts(attempt, attempt.tracker.take_refused())
        for ready in ready_list:
            self._validations.before_commit(ready)
            self._commits.submit(attempt, ready)

    def _on_upload_failed(self, attempt: Attempt, message: UploadFailedMessage) -> None:
        if self._run_config.checkpoint_config.upload_failure_policy != "skip":
            # Fail now: an ASYNC upload's error would otherwise surface only at that rank's
            # next report(), while training goes on past a lost checkpoint.
            if not any(f.rank == message.rank for f in attempt.failures):
                attempt.failures.append(WorkerFailure(
                    rank=message.rank, traceback="",
                    summary=f"The upload of report {message.index}'s checkpoint failed "
                    f"after retries: {message.error}"))
            return
        reason = (f"The checkpoint of report {message.index} was skipped: rank "
                  f"{message.rank}: {message.error}")
        pending = attempt.tracker.skip(message.index, reason)
        logger.warning("Skipping the checkpoint of report %d: rank %d could not upload it (%s)",
                       message.index, message.rank, message.error)
        if pending is not None and pending.dir_name is not None:
            self._manager.delete_uncommitted([pending.dir_name])
            attempt.skipped_dirs[message.index] = pending.dir_name
        elif message.index in attempt.skipped_dirs:
            # A second rank's upload of a report already skipped failed too: what it wrote
            # after the first deletion goes as well.
            self._manager.delete_uncommitted([attempt.skipped_dirs[message.index]])
        self._broadcast(attempt, CommittedMessage(message.index, None, skipped=True,
                                                  error=reason))
        self._callbacks.skipped(message.index)

    # --- ends of attempts ----------------------------------------------------------------

    def _wait_for_commits(self, attempt: Attempt) -> None:
        while attempt.commits_in_flight > 0:
            wait([self._channels.wake_r], 1.0)
            self._channels.clear_wake()
            while (item := self._channels.next_item()) is not None:
                kind, payload = item
                if kind == "committed":
                    self._on_committed(attempt, *payload)
                elif kind == "connection":
                    payload[0].close()

    def _end_failed_attempt(self, attempt: Attempt, failure: AttemptFailure) -> BaseException:
        self._backend.kill()
        for connection in attempt.connections.values():
            connection.close()
        attempt.connections.clear()
        self._wait_for_commits(attempt)
        self._manager.delete_uncommitted(attempt.tracker.pending_dir_names())
        # Each rank's own exception, as Ray Train's worker_failures; the text says where
        # the committed checkpoints stay.
        error = worker_group_error(attempt.failures, failure.reason, self._manager.run.display())
        attempt.resume_damaged = self._resume_found_damaged(attempt, failure, error)
        with self._validations.paused():
            failures = self._manager.index.failures + (0 if attempt.resume_damaged else 1)
            self._manager.save_index(failures=failures,
                                     next_report_index=self._next_report_index)
        now = time.time()
        errors = failure_records(attempt.failures, error)
        self._last_error = _run_error(errors) or error_summary(error, ranks=failure.ranks)
        self._events.append({
            "type": "failure", "attempt": attempt.number, "t": now,
            "ranks": list(failure.ranks), "reason": failure.reason.splitlines()[0],
            "last_commit_t": attempt.last_commit_t or attempt.started_at,
            "errors": errors,
            "counted": not attempt.resume_damaged,
        })
        self._flush_logs()
        self._view.on_failure(attempt.number, failure.reason,
                              attempt.last_commit_t or attempt.started_at,
                              not attempt.resume_damaged)
        self._callbacks.failed(error)
        return error

    def _resume_found_damaged(self, attempt: Attempt, failure: AttemptFailure,
                              error: WorkerGroupError) -> bool:
        """Whether a rank failed on damage while the attempt's resume checkpoint was only
        size-checked: then that checkpoint is verified in full before the next attempt
        (choose_resume drops it if damaged) and the failure is not counted. Once it was
        verified in full, such a failure counts like any other."""
        resume = attempt.resume
        if resume is None or failure.fatal or not any(
                isinstance(exc, CheckpointDamagedError)
                for exc in error.worker_failures.values()):
            return False
        if resume.dir_name in self._manager.fully_verified:
            return False
        self._manager.suspects.add(resume.dir_name)
        return True

    def _finish(self, attempt: Attempt) -> RunOutcome:
        self._backend.shutdown(grace_s=5.0)
        for connection in attempt.connections.values():
            connection.close()
        # As in Ray Train, a run ends once its validations have finished.
        self._validations.wait_idle()
        # Every rank has stopped writing: skipped partial uploads go now, before the final
        # index write (on a full disk their space is what that write needs), then the
        # deletions that failed earlier in the run are tried once more.
        self._manager.delete_uncommitted(sorted(set(attempt.skipped_dirs.values())))
        left = self._commits.call_on_commit_thread(self._manager.retry_deletions)
        if left:
            logger.warning("Could not delete %d checkpoint directories the run no longer "
                           "needs (%s): the storage still refuses; a later fit() of this run "
                           "or `cairn prune` deletes them", len(left), ", ".join(left))
            self._events.append({"type": "deletions_failed", "dir_names": left,
                                 "t": time.time()})
        self._manager.save_index(next_report_index=self._next_report_index)
        rank0 = attempt.done.get(0)
        value = cloudpickle.loads(rank0.return_value) if rank0 and rank0.return_value else None
        return RunOutcome(return_value=value, last_metrics=self._last_metrics)

    def _close(self, end: dict[str, Any]) -> None:
        self._channels.stop_accepting()
        self._validations.close()
        self._commits.close()
        try:
            try:
                self._backend.kill()
            finally:
                stop_standby = getattr(self._backend, "stop_standby", None)
                if stop_standby is not None:
                    stop_standby()
        finally:
            self._events.append({"type": "session_end", "t": time.time(), **end})
            for log in (self._history, self._events):
                try:
                    log.flush()
                except Exception:
                    logger.warning("Could not flush a run log", exc_info=True)
            if self._storage_token is not None:
                remove_storage_marker(self._manager.run, self._manager.retry)
            self._channels.close()


def _run_error(errors: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The error a failed run reads back with (``Result.from_path``, ``cairn show``): the
    first cause's own exception (``errors`` come causes first), as the user's train
    function raised it, with every rank that failed the same way."""
    if not errors:
        return None
    first = errors[0]
    ranks = [rank for error in errors if (error["type"], error["message"]) == (
        first["type"], first["message"]) for rank in error["ranks"]]
    return {"type": first["type"], "ranks": sorted(ranks), "message": first["message"]}
