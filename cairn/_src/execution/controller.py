"""The controller: runs attempts of a worker group until the run finishes or fails.

It lives in the driver process. One thread (the caller of ``fit()``) runs an event loop
that waits, without polling, on the workers' connections, on their exit notifications and
on a wake-up pipe fed by two helper threads: the acceptor (authenticated connections of
new workers) and the committer (checkpoint commits, in report order, off the loop so
storage latency never delays another rank's message).

Policies decide (retention, failures), the controller acts.
"""

from __future__ import annotations

import logging
import os
import queue
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import (
    Connection,
    Listener,
    answer_challenge,
    deliver_challenge,
    wait,
)
from typing import Any

import cloudpickle

from cairn._src.checkpoint.manager import CheckpointManager
from cairn._src.config import RunConfig, ScalingConfig
from cairn._src.errors import ConfigError, ReportError, WorkerGroupError
from cairn._src.execution.backend import WorkerHandle, make_backend
from cairn._src.execution.failure_policy import AttemptFailure, FailureDecision, FailurePolicy
from cairn._src.execution.local_backend import Bootstrap, abort_connection, disable_nagle
from cairn._src.execution.messages import (
    CheckpointView,
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
from cairn._src.execution.progress import check_progress
from cairn._src.execution.reports import ReadyCheckpoint, ReportTracker, describe_ranks
from cairn._src.execution.state import ControllerState, StateMachine
from cairn._src.execution.worker_errors import WorkerFailure, group_failures
from cairn._src.run.segment_log import SegmentLog
from cairn._src.storage.registry import export_registrations

logger = logging.getLogger(__name__)

# How long to wait, after the first failure of an attempt, for other ranks' errors to
# arrive so they are reported together.
_FAILURE_GRACE_S = 0.2
_HISTORY_FLUSH_S = 1.0
_LAST_MESSAGE_GRACE_S = 2.0
_HANDSHAKE_TIMEOUT_S = 10.0
_MESSAGES_PER_WAKE = 1000
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


@dataclass
class RunOutcome:
    return_value: Any = None
    error: BaseException | None = None
    last_metrics: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Attempt:
    number: int
    tracker: ReportTracker
    resume: CheckpointView | None
    first_report_index: int
    started_at: float
    workers: list[WorkerHandle] = field(default_factory=list)
    connections: dict[int, Connection] = field(default_factory=dict)
    connected: set[int] = field(default_factory=set)
    skipped_dirs: dict[int, str] = field(default_factory=dict)
    done: dict[int, DoneMessage] = field(default_factory=dict)
    failures: list[WorkerFailure] = field(default_factory=list)
    fatal: bool = False
    commits_in_flight: int = 0
    first_report_seen: bool = False
    train_started: bool = False
    announced_dirs: set[str] = field(default_factory=set)
    last_commit_t: float | None = None


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


def placement(workers: list[WorkerHandle]) -> dict[int, tuple[int, int, int]]:
    """rank -> (local rank, local world size, node rank); nodes numbered by lowest rank."""
    by_node: dict[str, list[int]] = {}
    for worker in sorted(workers, key=lambda w: w.rank):
        by_node.setdefault(worker.node_id, []).append(worker.rank)
    result = {}
    for node_rank, ranks in enumerate(by_node.values()):
        for local_rank, rank in enumerate(ranks):
            result[rank] = (local_rank, len(ranks), node_rank)
    return result


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
        self._machine = StateMachine()
        self._authkey = secrets.token_bytes(32)
        self._backend = make_backend(scaling, run_config)
        self._listener = Listener((self._backend.bind_host, 0))
        self._inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._wake_r, self._wake_w = os.pipe()
        self._commits: queue.Queue[tuple[ReadyCheckpoint, int] | None] = queue.Queue()
        self._closing = False
        self._last_metrics: dict[str, Any] = {}
        self._payload = (
            cloudpickle.dumps(spec.train_fn),
            cloudpickle.dumps(spec.config),
            _pickle_registrations(),
            cloudpickle.dumps(run_config.storage_retry),
            cloudpickle.dumps(spec.setup_hooks),
            cloudpickle.dumps(spec.teardown_hooks),
        )
        self._acceptor = threading.Thread(target=self._accept_loop, name="cairn-acceptor",
                                          daemon=True)
        self._committer = threading.Thread(target=self._commit_loop, name="cairn-committer",
                                           daemon=True)

    @property
    def state(self) -> ControllerState:
        return self._machine.state

    # --- helper threads ------------------------------------------------------------------

    def _post(self, kind: str, payload: Any) -> None:
        self._inbox.put((kind, payload))
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def _accept_loop(self) -> None:
        while not self._closing:
            try:
                # The listener has no authkey: the handshake runs on a thread of its own,
                # with a deadline, so a peer that connects and says nothing (a port scan on
                # a cluster node) cannot hold up the workers behind it.
                connection = self._listener.accept()
            except OSError:
                if self._closing:
                    return
                continue
            if self._closing:
                connection.close()
                return
            threading.Thread(target=self._handshake, args=(connection,),
                             name="cairn-handshake", daemon=True).start()

    def _handshake(self, connection: Connection) -> None:
        deadline = threading.Timer(_HANDSHAKE_TIMEOUT_S, abort_connection, (connection,))
        deadline.start()
        try:
            deliver_challenge(connection, self._authkey)
            answer_challenge(connection, self._authkey)
            disable_nagle(connection)
            hello = connection.recv()
        except Exception as exc:
            connection.close()
            if not self._closing:
                # A peer without the run's secret, or one that stalled or hung up.
                logger.warning("Refused a connection to the controller: %s", exc)
            return
        finally:
            deadline.cancel()
        self._post("connection", (connection, hello))

    def _commit_loop(self) -> None:
        while True:
            item = self._commits.get()
            if item is None:
                return
            ready, attempt = item
            try:
                outcome = self._manager.commit(ready, attempt=attempt)
            except BaseException as exc:
                logger.error("Commit of report %d failed: %s", ready.index, exc)
                self._post("committed", (ready, None, exc))
                continue
            self._post("committed", (ready, outcome, None))
            # After the workers hear of the commit: the event log (a driver killed later
            # still leaves the timeline up to its last checkpoint), then the deletions
            # retention decided, which the written index no longer references.
            try:
                self._events.flush()
            except Exception:
                logger.warning("Could not flush the event log", exc_info=True)
            self._manager.delete_dropped(outcome.dropped)

    # --- the run -------------------------------------------------------------------------

    def run(self) -> RunOutcome:
        self._acceptor.start()
        self._committer.start()
        self._events.append({"type": "session_start", "t": time.time()})
        try:
            return self._run_attempts()
        finally:
            self._close()

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
            failures = self._manager.index.failures
            decision = self._policy.decide(failure, failures - 1)
            logger.warning("Attempt %d failed (%s); failure %d of %s allowed: %s", attempt.number,
                           failure.reason.splitlines()[0], failures,
                           "unlimited" if self._policy.max_failures == -1
                           else self._policy.max_failures, decision.value)
            if decision is FailureDecision.RAISE:
                self._machine.transition(ControllerState.ERRORED, "failure budget spent"
                                         if not failure.fatal else "fatal error")
                return RunOutcome(error=error, last_metrics=self._last_metrics)
            self._machine.transition(ControllerState.RESTARTING, failure.reason.splitlines()[0])

    def _start_attempt(self) -> _Attempt:
        index = self._manager.index
        number = index.attempts
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
        attempt = _Attempt(
            number=number,
            tracker=ReportTracker(self._scaling.num_workers, used_dir_names=used),
            resume=resume,
            first_report_index=self._next_report_index,
            started_at=time.time(),
        )
        self._events.append({"type": "attempt_start", "attempt": number, "t": attempt.started_at,
                             "resume": resume.dir_name if resume else None})
        self._events.flush()
        logger.info("Attempt %d: %d workers, resuming from %s", number,
                    self._scaling.num_workers, resume.dir_name if resume else "scratch")
        port = self._listener.address[1]
        env = self._spec.attempt_env(number) if self._spec.attempt_env else {}
        bootstrap = Bootstrap((self._backend.advertise_host(), port), self._authkey, number)
        attempt.workers = self._backend.start(self._scaling.num_workers, bootstrap, env=env)
        return attempt

    def _setup_message(self, attempt: _Attempt, rank: int) -> SetupMessage:
        train_fn, config, _, retry, hooks, teardown = self._payload
        checkpoint_config = self._run_config.checkpoint_config
        local_rank, local_world_size, node_rank = placement(attempt.workers)[rank]
        return SetupMessage(
            rank=rank,
            world_size=self._scaling.num_workers,
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
            setup_hooks=hooks,
            teardown_hooks=teardown,
        )

    # --- the event loop ------------------------------------------------------------------

    def _loop(self, attempt: _Attempt) -> AttemptFailure | None:
        timeout_s = self._run_config.failure_config.collective_timeout_s
        exited: set[int] = set()
        failure_deadline: float | None = None
        next_flush = time.monotonic() + _HISTORY_FLUSH_S
        while True:
            watchers = {w.exit_watcher.fileno(): w for w in attempt.workers if w.rank not in exited}
            connections = {c: r for r, c in attempt.connections.items()}
            now = time.monotonic()
            deadline = min(d for d in (failure_deadline, next_flush, now + 1.0) if d is not None)
            ready = wait([self._wake_r, *connections, *watchers], max(0.0, deadline - now))
            if self._wake_r in ready:
                os.read(self._wake_r, 4096)
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
                if time.monotonic() >= failure_deadline or len(exited) == len(attempt.workers):
                    return AttemptFailure(
                        ranks=tuple(sorted({f.rank for f in attempt.failures})),
                        reason=group_failures(attempt.failures),
                        fatal=attempt.fatal,
                    )
                continue
            if len(attempt.done) == len(attempt.workers) and attempt.commits_in_flight == 0:
                return None

    def _check_started(self, attempt: _Attempt) -> None:
        if len(attempt.connected) == len(attempt.workers):
            return
        if time.time() - attempt.started_at > _WORKER_START_TIMEOUT_S:
            missing = sorted({w.rank for w in attempt.workers} - attempt.connected)
            attempt.failures.append(WorkerFailure(
                rank=missing[0], traceback="",
                summary=f"{describe_ranks(missing)} did not connect to the controller within "
                f"{_WORKER_START_TIMEOUT_S:g}s of starting"))

    def _check_progress(self, attempt: _Attempt, timeout_s: float) -> None:
        problem = check_progress(attempt.tracker, attempt.done,
                                 num_workers=len(attempt.workers), timeout_s=timeout_s)
        if problem is not None:
            attempt.fatal = attempt.fatal or problem.fatal
            attempt.failures.append(WorkerFailure(rank=problem.rank, summary=problem.summary,
                                                  traceback=""))

    def _drain_inbox(self, attempt: _Attempt) -> None:
        while True:
            try:
                kind, payload = self._inbox.get_nowait()
            except queue.Empty:
                return
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

    def _read_connection(self, attempt: _Attempt, rank: int, connection: Connection, *,
                         everything: bool = False) -> None:
        try:
            # Bounded, so one chatty rank cannot hold up the others' exits and commits;
            # after the worker exited, everything it sent is read.
            read = 0
            while (everything or read < _MESSAGES_PER_WAKE) and connection.poll():
                self._handle(attempt, connection.recv())
                read += 1
        except (EOFError, OSError):
            attempt.connections.pop(rank, None)
            connection.close()
            if rank not in attempt.done and not any(f.rank == rank for f in attempt.failures):
                attempt.failures.append(self._describe_lost(attempt, rank))

    def _describe_lost(self, attempt: _Attempt, rank: int) -> WorkerFailure:
        """A worker's connection closed without Done: say how its process ended."""
        worker = next(w for w in attempt.workers if w.rank == rank)
        # A dying process closes its socket a moment before it can be reaped.
        if not worker.wait_exit(0.5):
            return WorkerFailure(rank=rank, traceback="",
                                 summary=f"Worker rank {rank} (pid {worker.pid}) closed its "
                                 "connection to the controller")
        return WorkerFailure(rank=rank, traceback="",
                             summary=f"Worker rank {rank} (pid {worker.pid}) "
                             f"{worker.describe_exit()}")

    def _handle(self, attempt: _Attempt, message: object) -> None:
        if isinstance(message, ReportMessage):
            self._on_report(attempt, message)
        elif isinstance(message, UploadedMessage):
            if message.index in attempt.skipped_dirs:
                # Another rank's upload failed and the report was dropped: this late part
                # is removed too.
                self._manager.delete_uncommitted([attempt.skipped_dirs[message.index]])
                return
            attempt.tracker.on_uploaded(message)
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
        elif isinstance(message, ErrorMessage):
            attempt.fatal = attempt.fatal or message.fatal
            attempt.failures.append(WorkerFailure(
                rank=message.rank, summary=f"{message.error_type}: {message.message}",
                traceback=message.traceback, exception=message.exception,
            ))

    def _send(self, attempt: _Attempt, rank: int, message: object) -> None:
        """Send to one worker; a worker gone meanwhile becomes that rank's failure."""
        connection = attempt.connections.get(rank)
        if connection is None:
            return
        try:
            connection.send(message)
        except OSError:
            attempt.connections.pop(rank, None)
            connection.close()
            if rank not in attempt.done and not any(f.rank == rank for f in attempt.failures):
                attempt.failures.append(self._describe_lost(attempt, rank))

    def _broadcast(self, attempt: _Attempt, message: object) -> None:
        for rank in list(attempt.connections):
            self._send(attempt, rank, message)

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

    def _on_report(self, attempt: _Attempt, message: ReportMessage) -> None:
        self._next_report_index = max(self._next_report_index, message.index + 1)
        if not attempt.first_report_seen:
            attempt.first_report_seen = True
            self._events.append({"type": "first_report", "attempt": attempt.number,
                                 "t": time.time()})
        if message.rank == 0:
            self._last_metrics = message.metrics
            record: dict[str, Any] = {"report_index": message.index, "attempt": attempt.number,
                                      "time": message.sent_at, "metrics": message.metrics}
            if message.checkpoint is not None:
                record["checkpoint_dir_name"] = message.checkpoint.dir_name
            self._history.append(record)
            for callback in self._run_config.callbacks:
                hook = getattr(callback, "on_report", None)
                if hook is not None:
                    hook(message.index, message.metrics)
        verdicts = attempt.tracker.on_report(message)
        intent = message.checkpoint
        if (intent is not None and intent.explicit_dir_name and intent.mode != "NO_UPLOAD"
                and any(v.error is None for v in verdicts)
                and intent.dir_name not in attempt.announced_dirs):
            # Written before the upload starts: a driver that dies mid-upload leaves a
            # directory the next driver knows it may delete.
            attempt.announced_dirs.add(intent.dir_name)
            self._events.append({"type": "checkpoint_started", "dir_name": intent.dir_name,
                                 "index": message.index, "t": time.time()})
            self._flush_logs()
        for verdict in verdicts:
            reply = (ProceedMessage(verdict.index) if verdict.error is None
                     else RejectMessage(verdict.index, verdict.error))
            self._send(attempt, verdict.rank, reply)
        self._enqueue_ready(attempt)

    def _enqueue_ready(self, attempt: _Attempt) -> None:
        try:
            ready_list = attempt.tracker.take_ready()
        except ReportError as exc:
            attempt.fatal = True
            attempt.failures.append(WorkerFailure(rank=0, summary=str(exc), traceback=""))
            return
        for ready in ready_list:
            attempt.commits_in_flight += 1
            self._commits.put((ready, attempt.number))

    def _on_committed(self, attempt: _Attempt, ready: ReadyCheckpoint, outcome: Any,
                      error: BaseException | None) -> None:
        attempt.commits_in_flight -= 1
        if error is not None:
            attempt.failures.append(WorkerFailure(
                rank=min(ready.ranks), traceback="",
                summary=f"Commit of checkpoint {ready.dir_name} failed: {error}"))
            message = CommittedMessage(ready.index, None, error=f"commit failed: {error}")
        else:
            attempt.last_commit_t = time.time()
            holder = self._manager.entry_holding(outcome.view.data)
            if holder is not None:
                attempt.tracker.mark_used(holder)
            self._events.append({"type": "commit", "index": ready.index, "t": time.time(),
                                 "seconds": outcome.seconds, "bytes": ready.bytes_uploaded})
            message = CommittedMessage(ready.index, outcome.view)
            for callback in self._run_config.callbacks:
                hook = getattr(callback, "on_checkpoint", None)
                if hook is not None:
                    hook(outcome.view.dir_name, ready.metrics)
        self._broadcast(attempt, message)

    def _on_upload_failed(self, attempt: _Attempt, message: UploadFailedMessage) -> None:
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
        self._broadcast(attempt, CommittedMessage(message.index, None, skipped=True,
                                                  error=reason))

    # --- ends of attempts ----------------------------------------------------------------

    def _wait_for_commits(self, attempt: _Attempt) -> None:
        while attempt.commits_in_flight > 0:
            wait([self._wake_r], 1.0)
            try:
                os.read(self._wake_r, 4096)
            except BlockingIOError:
                pass
            while True:
                try:
                    kind, payload = self._inbox.get_nowait()
                except queue.Empty:
                    break
                if kind == "committed":
                    self._on_committed(attempt, *payload)
                elif kind == "connection":
                    payload[0].close()

    def _end_failed_attempt(self, attempt: _Attempt, failure: AttemptFailure) -> BaseException:
        self._backend.kill()
        for connection in attempt.connections.values():
            connection.close()
        attempt.connections.clear()
        self._wait_for_commits(attempt)
        self._manager.delete_uncommitted(attempt.tracker.pending_dir_names())
        failures = self._manager.index.failures + 1
        self._manager.save_index(failures=failures, next_report_index=self._next_report_index)
        now = time.time()
        self._events.append({
            "type": "failure", "attempt": attempt.number, "t": now,
            "ranks": list(failure.ranks), "reason": failure.reason.splitlines()[0],
            "last_commit_t": attempt.last_commit_t or attempt.started_at,
        })
        self._flush_logs()
        error = WorkerGroupError(failure.reason)
        for callback in self._run_config.callbacks:
            hook = getattr(callback, "on_failure", None)
            if hook is not None:
                hook(error)
        return error

    def _finish(self, attempt: _Attempt) -> RunOutcome:
        self._backend.shutdown(grace_s=5.0)
        for connection in attempt.connections.values():
            connection.close()
        self._manager.save_index(next_report_index=self._next_report_index)
        rank0 = attempt.done.get(0)
        value = cloudpickle.loads(rank0.return_value) if rank0 and rank0.return_value else None
        return RunOutcome(return_value=value, last_metrics=self._last_metrics)

    def _close(self) -> None:
        self._closing = True
        try:
            # accept() does not return when the listener closes under it: knock once.
            socket.create_connection(("127.0.0.1", self._listener.address[1]), 5).close()
        except OSError:
            pass
        self._acceptor.join(5.0)
        self._commits.put(None)
        self._committer.join()
        try:
            self._backend.kill()
        finally:
            self._listener.close()
            self._events.append({"type": "session_end", "t": time.time()})
            for log in (self._history, self._events):
                try:
                    log.flush()
                except Exception:
                    logger.warning("Could not flush a run log", exc_info=True)
            os.close(self._wake_r)
            os.close(self._wake_w)
