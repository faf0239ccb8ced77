"""The controller: runs attempts of a worker group until the run finishes or fails.

It lives in the driver process, on the thread that called ``fit()``. It is an explicit
state machine (:mod:`state`): :meth:`Controller.step` performs one transition and returns
it, and :meth:`Controller.run` steps until FINISHED or ERRORED:

=============  =====================================================================
state          what ``step()`` does
=============  =====================================================================
INITIALIZING   starts the first attempt's workers: STARTING
STARTING       runs the attempt's loop until every worker connected: RUNNING; or
               until it failed: RESTARTING (retried) or ERRORED (fatal, budget spent)
RUNNING        runs the loop until every rank is done: FINISHING; or failed, as above
RESTARTING     starts the next attempt's workers: STARTING
FINISHING      shuts the workers down and writes the final index: FINISHED
=============  =====================================================================

The waits and the handling of the workers' messages are one attempt's
:class:`AttemptLoop`. Every collaborator (backend, inbox, connections, commit pipeline,
validations, live view, callbacks, clock) is a constructor argument;
:func:`assembly.build_controller` makes the real ones. The :class:`CheckpointManager` is
touched only from the commit thread: the controller's index writes and deletions are
queued there.

Policies decide (retention, failures), the controller acts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

import cloudpickle

from cairn._src.backends.protocol import RankReplacer
from cairn._src.checkpoint.index import RunIndex
from cairn._src.checkpoint.views import CheckpointView
from cairn._src.config.run import ScalingConfig
from cairn._src.controller.attempt import Attempt
from cairn._src.controller.attempt_loop import FINISHED, AttemptLoop, LoopParts, RunProgress
from cairn._src.controller.datasets import DataIngest
from cairn._src.controller.failure_errors import (
    DAMAGE,
    NotStarted,
    damaged_resume,
    error_summary,
    failure_records,
    run_error,
    save_counts,
    worker_group_error,
)
from cairn._src.controller.failure_policy import AttemptFailure, FailureDecision, FailurePolicy
from cairn._src.controller.payload import SetupFactory, TrainSpec, WorkerPayload
from cairn._src.controller.preemption import preemption_error
from cairn._src.controller.reports import NanScoreWarning, ReportTracker
from cairn._src.controller.services import AttemptServices
from cairn._src.controller.state import ControllerState, StateMachine, Transition
from cairn._src.controller.survivors import (
    KeptRanks,
    SurvivorPlan,
    plan_restores,
    plan_survivors,
    planned_source,
)
from cairn._src.controller.worker_failures import group_failures
from cairn._src.errors import StorageError
from cairn._src.observe.driver_events import AttemptFailed, Notice, WorkerGroupStarted
from cairn._src.observe.live_state import give_up_notice, start_notice
from cairn._src.run.events import (
    AttemptStart,
    DeletionsFailed,
    ErrorInfo,
    Failure,
    RestorePlanned,
    SessionEnd,
    SessionStart,
)
from cairn._src.run.storage_check import remove_storage_marker, write_storage_marker
from cairn._src.storage.retry import is_transient
from cairn._src.wire.bootstrap import Bootstrap
from cairn._src.wire.messages import RejoinMessage

logger = logging.getLogger(__name__)

__all__ = ["Controller", "RunOutcome", "TrainSpec"]


@dataclass
class RunOutcome:
    return_value: Any = None
    error: BaseException | None = None
    last_metrics: dict[str, Any] = field(default_factory=dict)
    last_report_index: int | None = None


class Controller:
    def __init__(
        self,
        spec: TrainSpec,
        scaling: ScalingConfig,
        parts: LoopParts,
        *,
        payload: WorkerPayload,
        policy: FailurePolicy,
        experiment_name: str,
        next_report_index: int,
        finished_before: bool = False,
        data: DataIngest | None = None,
    ) -> None:
        self._spec = spec
        # Trainer(datasets=...): the Ray instance Ray Data runs on, and each attempt's split.
        self._data = data
        self._scaling = scaling
        self._parts = parts
        self._payload = payload
        self._policy = policy
        self._experiment_name = experiment_name
        self._finished_before = finished_before
        self._progress = RunProgress(next_report_index)
        self._machine = StateMachine()
        self._storage_token: str | None = None
        self._attempts_this_session = 0
        self._loop: AttemptLoop | None = None
        self._outcome: RunOutcome | None = None
        self._last_error: dict[str, Any] | None = None
        self._opened = False
        # FailureConfig(keep_survivors=True) with a backend that can replace one rank.
        failure_config = parts.run_config.failure_config
        self._keep_survivors = False
        if failure_config.keep_survivors and isinstance(parts.backend, RankReplacer):
            refusal = parts.backend.replace_refusal()
            self._keep_survivors = refusal is None
            if refusal is not None:
                logger.warning("FailureConfig(keep_survivors=True) does not apply to this "
                               "run: %s", refusal)
        # The ranks kept across the restart in progress (None: the whole group restarts).
        self._kept: KeptRanks | None = None
        self._score_attribute = parts.run_config.checkpoint_config.checkpoint_score_attribute
        self._nan_warning = NanScoreWarning()  # once per run: its attempts' trackers share it

    @property
    def state(self) -> ControllerState:
        return self._machine.state

    @property
    def attempt(self) -> Attempt | None:
        """The current attempt (None before the first)."""
        return self._loop.attempt if self._loop is not None else None

    @property
    def outcome(self) -> RunOutcome | None:
        """How the run ended, once FINISHED or ERRORED."""
        return self._outcome

    # --- the run -------------------------------------------------------------------------

    def run(self) -> RunOutcome:
        self.open()
        # How the session ended, for `cairn ls` and Result.from_path: "finished", "failed"
        # (with the error), or "interrupted" (Ctrl-C, or the driver itself broke).
        end: dict[str, Any] = {"status": "interrupted"}
        try:
            while self._outcome is None:
                self.step()
            outcome = self._outcome
            end = ({"status": "finished"} if outcome.error is None
                   else {"status": "failed", "error": self._last_error})
            return outcome
        except BaseException as exc:
            if not isinstance(exc, KeyboardInterrupt):
                end = {"status": "failed", "error": error_summary(exc, ranks=())}
            raise
        finally:
            self.close(end)

    def open(self) -> None:
        """Start the helper threads and the session (before the first :meth:`step`)."""
        parts = self._parts
        parts.channels.start()
        parts.commits.start()
        self._opened = True
        parts.events.emit(SessionStart(t=parts.clock.time()))
        parts.view.start()

    def step(self) -> Transition:
        """Perform one transition of the state table and return it.

        Raises :class:`RuntimeError` once the run is FINISHED or ERRORED.
        """
        state = self.state
        if state in (ControllerState.INITIALIZING, ControllerState.RESTARTING):
            if state is ControllerState.INITIALIZING:
                # Every worker reads it back before training: storage a node cannot see
                # fails the run at once.
                manager = self._parts.manager
                self._storage_token = write_storage_marker(manager.run, manager.retry)
            change = self._machine.transition(ControllerState.STARTING,
                                              "starting a worker group")
            try:
                self._loop = self._start_attempt()
            except NotStarted as exc:
                return self._not_started(exc.error)
            return change
        loop = self._loop
        if state is ControllerState.STARTING and loop is not None:
            while not loop.all_connected and loop.ended is None:
                loop.turn()
            if loop.all_connected:
                return self._machine.transition(ControllerState.RUNNING,
                                                "all workers connected")
            return self._end_attempt(loop)
        if state is ControllerState.RUNNING and loop is not None:
            while loop.ended is None:
                loop.turn()
            return self._end_attempt(loop)
        if state is ControllerState.FINISHING and loop is not None:
            self._outcome = self._finish(loop)
            return self._machine.transition(ControllerState.FINISHED, "run complete")
        raise RuntimeError(
            f"Controller.step() was called in state {state.value}: the run is over "
            "(FINISHED or ERRORED). Read Controller.outcome instead of stepping again.")

    def _end_attempt(self, loop: AttemptLoop) -> Transition:
        attempt, failure = loop.attempt, loop.ended
        if failure is FINISHED:
            return self._machine.transition(ControllerState.FINISHING, "all workers finished")
        assert isinstance(failure, AttemptFailure)
        failure, error, index, failed = self._end_failed_attempt(loop, failure)
        decision = None if attempt.resume_damaged else self._judge(failure, index,
                                                                   attempt.number)
        if attempt.resume_damaged:
            logger.warning(
                "Attempt %d: a rank found the checkpoint it resumed from, %s, damaged "
                "(%s). The next attempt verifies it in full and, if it is damaged, falls "
                "back to the previous committed checkpoint on every rank; this does not "
                "count as a failure.", attempt.number,
                attempt.resume.dir_name if attempt.resume else "-",
                failure.reason.splitlines()[0])
        # The event log, the live view and the callbacks (after_exception, on_failure) hear
        # of the failure after the log said it: a callback that raises there fails the run,
        # and the attempt's own failure is not lost behind the callback's error.
        self._parts.events.emit(failed)
        loop.flush_logs()
        if decision is None:
            return self._machine.transition(ControllerState.RESTARTING,
                                            "the resume checkpoint is damaged")
        return self._decide(failure, error, index, attempt.number, decision)

    def _judge(self, failure: AttemptFailure, index: RunIndex, number: int) -> FailureDecision:
        """The policy's decision on ``failure``, logged with its reason (``index``: the
        counts with this failure, written or not)."""
        failures = index.preemptions if failure.preemption is not None else index.failures
        budget = self._policy.budget(failure)
        decision = self._policy.decide(failure, failures - 1)
        logger.warning("Attempt %d failed (%s); %s %d of %s allowed: %s", number,
                       failure.reason.splitlines()[0],
                       "failure" if failure.preemption is None else "preemption", failures,
                       "unlimited" if budget == -1 else budget, decision.value)
        return decision

    def _decide(self, failure: AttemptFailure, error: BaseException, index: RunIndex,
                number: int, decision: FailureDecision) -> Transition:
        """Restart, or end the run once the failure budget is spent."""
        preempted = failure.preemption is not None
        budget = self._policy.budget(failure)
        if decision is FailureDecision.RAISE:
            latest = index.latest
            self._parts.events.emit(Notice(give_up_notice(
                self._experiment_name, attempt=number,
                max_failures=budget, fatal=failure.fatal,
                latest=latest.dir_name if latest is not None else None,
                argument="max_preemption_failures" if preempted else "max_failures")))
            self._outcome = RunOutcome(error=error, last_metrics=self._progress.last_metrics,
                                       last_report_index=self._progress.last_report_index)
            return self._machine.transition(ControllerState.ERRORED, "failure budget spent"
                                            if not failure.fatal else "fatal error")
        return self._machine.transition(ControllerState.RESTARTING,
                                        failure.reason.splitlines()[0])

    def _not_started(self, error: StorageError | OSError) -> Transition:
        """The driver's storage failed (after its retries) before any worker started: a
        failure counted against ``max_failures`` (an outage is retried); one no retry fixes
        (permission denied, a symbolic link loop) fails the run at once."""
        manager = self._parts.manager

        def count() -> tuple[int, RunIndex]:
            save_counts(manager, failures=manager.index.failures + 1)
            return manager.index.attempts, manager.index

        number, index = self._parts.commits.call_on_commit_thread(count)
        self._last_error = error_summary(error, ranks=())
        reason = (f"the driver could not read the run from storage to start the workers: "
                  f"{type(error).__name__}: {error}")
        failure = AttemptFailure(ranks=(), reason=reason, fatal=not is_transient(
            error.__cause__ or error))
        return self._decide(failure, error, index, number, self._judge(failure, index, number))

    # --- start of an attempt -------------------------------------------------------------

    def _start_attempt(self) -> AttemptLoop:
        parts = self._parts
        manager, clock = parts.manager, parts.clock
        next_report_index = self._progress.next_report_index

        def prepare() -> tuple[int, CheckpointView | None, set[str], RunIndex]:
            # On the commit thread, after the deletions it still has queued: the manager
            # has one owner, and a validation result is applied there too.
            manager.retry_deletions()
            number = manager.index.attempts
            # A commit whose index write failed after its manifest landed is settled
            # first (committed: adopted), so this attempt resumes from it consistently, and
            # the validation it asked for runs.
            parts.validations.settled(manager.settle_uncertain())
            resume = manager.choose_resume()
            manager.save_index(attempts=number + 1,
                               resumed_from=resume.dir_name if resume else None,
                               next_report_index=next_report_index)
            # Names of committed checkpoints, and of run-directory entries holding the data
            # of checkpoints committed by reference: an upload there would overwrite them.
            used = {r.dir_name for r in manager.index.checkpoints}
            used |= manager.names_holding_references()
            return number, resume, used, manager.index

        try:
            number, resume, used, index = parts.commits.call_on_commit_thread(prepare)
        except (StorageError, OSError) as exc:  # the driver's own; no worker started yet
            raise NotStarted(exc) from exc
        attempt = Attempt(
            number=number,
            tracker=self._tracker(self._scaling.max_workers, used, next_report_index),
            resume=resume,
            first_report_index=next_report_index,
            started_at=clock.time(),
        )
        if self._attempts_this_session == 0:
            parts.events.emit(Notice(start_notice(
                self._experiment_name, manager.run.display(), attempts=number,
                checkpoints=len(index.checkpoints),
                resume=resume.dir_name if resume else None,
                resume_report=resume.report_index if resume else None,
                finished_before=self._finished_before)))
        self._attempts_this_session += 1
        kept, self._kept = self._kept, None
        parts.events.emit(AttemptStart(t=attempt.started_at, attempt=number,
                                       resume=resume.dir_name if resume else None,
                                       kept=tuple(kept.keep) if kept else (),
                                       replaced=tuple(sorted(kept.replace)) if kept else ()))
        parts.events.flush()
        env = self._spec.attempt_env(number) if self._spec.attempt_env else {}
        if self._data is not None:
            env = {**env, **self._data.worker_env()}
        channels = parts.channels
        bootstrap = Bootstrap((parts.backend.advertise_host(), channels.port),
                              channels.authkey, number,
                              tls_certificate=channels.certificate_pem)
        if kept is not None and isinstance(parts.backend, RankReplacer):
            attempt.workers = parts.backend.replace(kept.replace, bootstrap, env=env)
            for connection in kept.connections.values():
                # A kept rank connects again for this attempt, in the same process; one
                # that died meanwhile fails this attempt through its exit, as any rank.
                try:
                    connection.send(RejoinMessage(number, dict(env)))
                except OSError:
                    pass
                connection.close()
        else:
            attempt.workers = parts.backend.start(self._scaling.max_workers, bootstrap,
                                                  env=env)
        # The world of this attempt is the group the backend started: an elastic range
        # (ScalingConfig.min_workers .. max_workers) may get fewer than it asked for.
        world_size = len(attempt.workers)
        attempt.tracker = self._tracker(world_size, used, next_report_index)
        services = AttemptServices(world_size, manager, parts.validations,
                                   parts.run_config.checkpoint_config)
        parts.events.emit(WorkerGroupStarted(number, world_size))
        logger.info("Attempt %d: %d workers, resuming from %s", number, world_size,
                    resume.dir_name if resume else "scratch")
        # One shard per worker of this attempt, produced near it (controller/datasets.py).
        split = (self._data.split([w.node_id for w in attempt.workers])
                 if self._data is not None else None)
        restores = plan_restores(
            resume.report_index if resume else None, kept, world_size,
            {rank: parts.driver_copies.files(resume.report_index, rank)
             for rank in range(world_size)} if resume and kept else None)
        for rank, plan in sorted(restores.items()):
            source, peer = planned_source(plan)
            parts.events.emit(RestorePlanned(t=clock.time(), attempt=number, rank=rank,
                                             kind=source, index=plan.report_index, peer=peer,
                                             reason=plan.reason))
        setup = SetupFactory(self._spec, self._payload, parts.run_config, manager.run,
                             self._experiment_name, self._storage_token, split,
                             keep_survivors=self._keep_survivors, restores=restores)
        return AttemptLoop(attempt, parts, self._progress, services,
                           registrations=self._payload.registrations,
                           setup_message=setup.message)

    # --- ends of attempts ----------------------------------------------------------------

    def _tracker(self, world_size: int, used: set[str], first_index: int) -> ReportTracker:
        return ReportTracker(world_size, used_dir_names=used, first_index=first_index,
                             score_attribute=self._score_attribute,
                             nan_warning=self._nan_warning)

    def _end_failed_attempt(
            self, loop: AttemptLoop, failure: AttemptFailure,
    ) -> tuple[AttemptFailure, BaseException, RunIndex, AttemptFailed]:
        parts, attempt = self._parts, loop.attempt
        manager = parts.manager
        ranks, reason = [f.rank for f in attempt.failures], group_failures(attempt.failures)
        self._kept = self._keep_or_kill(loop, failure)
        failure = loop.preemption_after_stop(failure)
        if failure.reason == reason and [f.rank for f in attempt.failures] == ranks:
            # Only summaries can have changed (exits seen late): the headline says them too.
            failure = replace(failure, reason=group_failures(attempt.failures))
        kept = self._kept.connections if self._kept is not None else {}
        for rank in [r for r in attempt.connections if r not in kept]:
            attempt.connections.pop(rank).close()
        # Commits still in flight are told to the kept ranks too: the copy a kept rank
        # holds of such a checkpoint becomes its committed one before the next attempt
        # restores from it (from that copy, not from storage).
        loop.wait_for_commits()
        attempt.connections.clear()
        pending = attempt.tracker.pending_dir_names()
        # Each rank's own exception, as Ray Train's worker_failures; the text says where
        # the committed checkpoints stay.
        error = worker_group_error(attempt.failures, failure.reason, manager.run.display())
        suspect = damaged_resume(attempt, failure, error)
        preempted = failure.preemption is not None
        next_report_index = self._progress.next_report_index

        def record() -> tuple[bool, RunIndex]:
            try:
                manager.delete_uncommitted(pending)
            except (StorageError, OSError) as exc:
                # The next attempt's start sweeps what never committed.
                logger.warning("The uncommitted reports %s are deleted later: %s",
                               sorted(pending), exc)
            # Once the resume checkpoint was verified in full, a failure on damage counts
            # like any other; before, it is verified in full first (choose_resume drops
            # it if damaged) and the failure is not counted.
            damaged = suspect is not None and suspect not in manager.fully_verified
            if damaged and suspect is not None:
                manager.suspects.add(suspect)
            if preempted:
                save_counts(manager, preemptions=manager.index.preemptions + 1,
                            next_report_index=next_report_index)
                return False, manager.index
            save_counts(manager, failures=manager.index.failures + (0 if damaged else 1),
                        next_report_index=next_report_index)
            return damaged, manager.index

        attempt.resume_damaged, index = parts.commits.call_on_commit_thread(record)
        now = parts.clock.time()
        errors = failure_records(attempt.failures, error)
        self._last_error = run_error(errors) or error_summary(error, ranks=failure.ranks)
        raised: BaseException = error
        if preempted:
            raised = preemption_error(failure, error, manager.run.display())
            self._last_error = error_summary(raised, ranks=failure.ranks)
        logged = Failure(t=now, attempt=attempt.number, ranks=tuple(failure.ranks),
                         reason=failure.reason.splitlines()[0],
                         last_commit_t=attempt.last_commit_t or attempt.started_at,
                         errors=tuple(e for e in map(ErrorInfo.parse, errors) if e is not None),
                         counted=not (attempt.resume_damaged or preempted),
                         preemption=preempted)
        return failure, raised, index, AttemptFailed(logged, failure.reason, error)

    def _keep_or_kill(self, loop: AttemptLoop, failure: AttemptFailure) -> KeptRanks | None:
        """Stop the ranks that may be kept and kill the others (see :mod:`survivors`); the
        kept ranks, or None when the whole group was killed."""
        attempt, backend = loop.attempt, self._parts.backend
        # Exits seen since the failure, before any kill of Cairn's own (whose exit says
        # nothing of how the rank ended): how each lost rank's process ended.
        attempt.settle_exits()
        if self._keep_survivors:  # what a rank sent before (its train function began)
            loop.read_waiting()
        plan = self._plan_survivors(loop, fatal=failure.fatal)
        damaged = any(name in f.summary for f in attempt.failures for name in DAMAGE)
        if plan.keep and not damaged and isinstance(backend, RankReplacer):
            timeout_s = self._parts.run_config.failure_config.stop_timeout_s
            # The failed ranks go first: their sockets close, so a kept rank blocked in a
            # collective with one of them fails there at once.
            attempt.replaced |= plan.replace
            backend.kill_ranks(plan.replace)
            stopped = loop.stop_ranks(set(plan.keep), failure.reason.splitlines()[0], timeout_s)
            attempt.settle_exits()  # a kept rank lost while stopping
            if stopped:
                # Planned again with what came while they stopped: a kept rank's own error,
                # its return, its exit or the end of its connection, and Ray's word that a
                # failed rank's node was preempted (its other ranks are then replaced).
                if not failure.fatal:
                    loop.note_preempted(failure)
                again = self._plan_survivors(loop, fatal=failure.fatal or attempt.fatal)
                if again.keep and again.keep <= loop.stopped & set(attempt.connections):
                    if again.replace - plan.replace:
                        attempt.replaced |= again.replace
                        backend.kill_ranks(again.replace - plan.replace)
                    logger.info("Attempt %d: %s", attempt.number, again.reason)
                    return KeptRanks({r: attempt.connections[r] for r in again.keep},
                                     again.replace, {r: loop.copies.get(r) for r in again.keep})
                reason = again.reason if not again.keep else "a kept rank went as it stopped"
            else:
                reason = "a kept rank did not stop"
            logger.warning("Attempt %d: restarting the whole group: %s", attempt.number,
                           reason)
        elif self._keep_survivors:
            logger.info("Attempt %d: restarting the whole group: %s", attempt.number,
                        plan.reason if not damaged else "the resume checkpoint is suspect")
        backend.kill()
        return None

    def _plan_survivors(self, loop: AttemptLoop, *, fatal: bool) -> SurvivorPlan:
        attempt = loop.attempt
        info = loop.preemption.info
        return plan_survivors(
            enabled=self._keep_survivors,
            can_replace=isinstance(self._parts.backend, RankReplacer),
            ranks=[w.rank for w in attempt.workers], failures=attempt.failures,
            # A rank whose train function returned is on its way out: replaced, not kept.
            exited=loop.exited | set(attempt.done), connected=attempt.connected,
            fatal=fatal, preempted=info.preempted_ranks if info is not None else (),
            started=attempt.started_ranks)

    def _finish(self, loop: AttemptLoop) -> RunOutcome:
        parts, attempt = self._parts, loop.attempt
        manager = parts.manager
        parts.backend.shutdown(grace_s=5.0)
        for connection in attempt.connections.values():
            connection.close()
        # As in Ray Train, a run ends once its validations have finished.
        parts.validations.wait_idle()
        # Reports that will never commit: skipped, or refused (a caught ReportError) or
        # left incomplete, which no later attempt's failure would clean up.
        uncommitted = sorted(set(attempt.skipped_dirs.values())
                             | set(attempt.tracker.pending_dir_names()))

        def delete() -> list[str]:
            # Every rank has stopped writing: their partial uploads go now, before the
            # final index write (on a full disk their space is what that write needs),
            # then the deletions that failed earlier in the run are tried once more.
            manager.delete_uncommitted(uncommitted)
            return manager.retry_deletions()

        left = parts.commits.call_on_commit_thread(delete)
        if left:
            logger.warning("Could not delete %d checkpoint directories the run no longer "
                           "needs (%s): the storage still refuses; a later fit() of this run "
                           "deletes them", len(left), ", ".join(left))
            parts.events.emit(DeletionsFailed(t=parts.clock.time(), dir_names=tuple(left)))
        next_report_index = self._progress.next_report_index
        parts.commits.call_on_commit_thread(
            lambda: manager.save_index(next_report_index=next_report_index))
        rank0 = attempt.done.get(0)
        value = cloudpickle.loads(rank0.return_value) if rank0 and rank0.return_value else None
        return RunOutcome(return_value=value, last_metrics=self._progress.last_metrics,
                          last_report_index=self._progress.last_report_index)

    def close(self, end: dict[str, Any]) -> None:
        """End the session: stop the helper threads and the workers, log ``end``."""
        parts = self._parts
        try:
            try:
                self._close(end)
            finally:
                # Also on Ctrl-C or a broken driver: the terminal is left as it was.
                parts.view.stop()
        finally:
            parts.inbox.close()

    def _close(self, end: dict[str, Any]) -> None:
        parts = self._parts
        parts.channels.stop_accepting()
        parts.validations.close()
        if self._opened:
            parts.commits.close()
        try:
            try:
                parts.backend.kill()
            finally:
                # Each worker's receiver sees its connection end, which ends the train
                # function's waits: a local-mode SYNC report off the main thread, say,
                # which the kill (an asynchronous exception there) cannot interrupt.
                for connection in self.attempt.connections.values() if self.attempt else ():
                    connection.close()
                parts.backend.stop_standby()
                if self._data is not None:
                    self._data.close()
        finally:
            parts.events.emit(SessionEnd(t=parts.clock.time(), status=end.get("status"),
                                         error=ErrorInfo.parse(end.get("error"))))
            for log in (parts.history, parts.event_log):
                try:
                    log.flush()
                except Exception:
                    logger.warning("Could not flush a run log", exc_info=True)
            if self._storage_token is not None:
                remove_storage_marker(parts.manager.run, parts.manager.retry)
            parts.channels.close()
