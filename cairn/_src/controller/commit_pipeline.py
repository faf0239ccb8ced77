"""The commit pipeline: checkpoints every rank uploaded are committed in report order.

Commits run on one named thread fed by a queue (``None`` stops it), off the controller
loop, so storage latency never delays another rank's message. Each result goes back to the
loop as a :class:`CommitResult` in its inbox; the loop then calls
:meth:`CommitPipeline.on_committed`, which tells the workers and emits the result once
to the run's observers (event log, live view, callbacks).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from cairn._src.checkpoint.manager import CheckpointManager
from cairn._src.checkpoint.reconcile import entry_holding
from cairn._src.checkpoint.views import ReadyCheckpoint, checkpoint_from_view
from cairn._src.config.run import RunConfig
from cairn._src.controller.attempt import Attempt
from cairn._src.controller.inbox import CommitResult, Inbox
from cairn._src.controller.worker_failures import WorkerFailure
from cairn._src.errors import CheckpointNotStoredError, RunLeaseError
from cairn._src.observe.driver_events import CheckpointCommitted, CommitFailed
from cairn._src.observe.observer import EventStream
from cairn._src.run.events import Commit
from cairn._src.wire.messages import CommittedMessage

T = TypeVar("T")

logger = logging.getLogger(__name__)


class CommitPipeline:
    """The commit thread and the loop's handling of its results."""

    def __init__(self, manager: CheckpointManager, events: EventStream, run_config: RunConfig,
                 inbox: Inbox,
                 broadcast: Callable[[Attempt, object], None]) -> None:
        self._manager = manager
        self._events = events
        self._run_config = run_config
        self._inbox = inbox
        self._broadcast = broadcast
        self._commits: queue.Queue[
            tuple[ReadyCheckpoint, int] | Callable[[], None] | None] = queue.Queue()
        self._committer = threading.Thread(target=self._commit_loop, name="cairn-committer",
                                           daemon=True)
        # Set once the fence found the lease taken over: nothing is committed after it.
        self._fenced: RunLeaseError | None = None

    def start(self) -> None:
        self._committer.start()

    def submit(self, attempt: Attempt, ready: ReadyCheckpoint) -> None:
        """Queue a checkpoint every rank uploaded (the loop's thread)."""
        attempt.commits_in_flight += 1
        self._commits.put((ready, attempt.number))

    def run_on_commit_thread(self, task: Callable[[], None]) -> None:
        """Run ``task`` on the commit thread, after the commits already queued (a
        validation result: the checkpoint manager has one writer)."""
        self._commits.put(task)

    def call_on_commit_thread(self, task: Callable[[], T]) -> T:
        """Run ``task`` on the commit thread once everything queued before it is done (the
        deletions retention decided after each commit included), wait, and return its
        result or raise its error. The checkpoint manager's deletion bookkeeping has one
        writer this way: a retry from the loop's thread could otherwise run before, or
        beside, a deletion the commit thread has still to try."""
        done = threading.Event()
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["value"] = task()
            except BaseException as exc:
                outcome["error"] = exc
            finally:
                done.set()

        self._commits.put(run)
        done.wait()
        if "error" in outcome:
            raise outcome["error"]
        value: T = outcome["value"]
        return value

    def close(self) -> None:
        """Stop the commit thread after the commits already queued."""
        self._commits.put(None)
        self._committer.join()

    def _commit_loop(self) -> None:
        """Take the queued tasks in order until ``None``. No task ends the thread: an error
        one of them did not handle goes to whoever waits for it (a commit's result, the
        caller of :meth:`call_on_commit_thread`) or, with nobody waiting, to the log, and
        the loop takes the next (a dead commit thread would leave every later commit and
        call waiting forever)."""
        while True:
            item = self._commits.get()
            if item is None:
                return
            try:
                if callable(item):
                    item()
                else:
                    self._commit(*item)
            except BaseException:
                logger.exception("A task of the commit thread failed; the thread goes on")

    def _commit(self, ready: ReadyCheckpoint, attempt: int) -> None:
        """Commit one checkpoint; its result goes to the loop's inbox, once, whatever
        happens. Then the event log and retention's deletions (errors logged)."""
        try:
            result = self._try_commit(ready, attempt)
        except BaseException as exc:
            logger.error("Commit of report %d failed: %s", ready.index, exc)
            result = CommitResult(ready, None, exc)
        self._inbox.post(result)
        if result.outcome is None:
            return
        # After the workers hear of the commit: the event log (a driver killed later still
        # leaves the timeline up to its last checkpoint), then the deletions retention
        # decided, which the written index no longer references (deferred, not lost, when
        # their record in the event log cannot be made durable: see delete_dropped()).
        try:
            self._events.flush()
        except Exception:
            logger.warning("Could not flush the event log", exc_info=True)
        try:
            self._manager.delete_dropped(result.outcome.dropped)
        except Exception:
            logger.exception("Could not delete the checkpoints retention dropped at report "
                             "%d", ready.index)

    def _try_commit(self, ready: ReadyCheckpoint, attempt: int) -> CommitResult:
        if self._fenced is not None:
            return CommitResult(ready, None, self._fenced)
        try:
            outcome = self._manager.commit(ready, attempt=attempt)
        except RunLeaseError as exc:
            self._fenced = exc
            logger.error("Not committing report %d: %s", ready.index, exc)
            return CommitResult(ready, None, exc)
        return CommitResult(ready, outcome, None,
                            holder=entry_holding(self._manager.run, outcome.view.data))

    def on_committed(self, attempt: Attempt, result: CommitResult) -> None:
        """A commit's result, on the loop's thread: tell the workers and the observers.

        Raises :class:`RunLeaseError` when the commit found the lease taken over: the run
        stops at once, without another commit or index write.
        """
        ready, outcome, error = result.ready, result.outcome, result.error
        attempt.commits_in_flight -= 1
        if isinstance(error, RunLeaseError):
            raise error
        if (isinstance(error, CheckpointNotStoredError)
                and self._run_config.checkpoint_config.upload_failure_policy == "skip"):
            # The store dropped what the workers uploaded: an upload that failed, which the
            # run's policy skips. The directory never committed; its deletion runs on the
            # commit thread, the checkpoint manager's one writer.
            reason = f"The checkpoint of report {ready.index} was skipped: {error}"
            logger.warning("Skipping the checkpoint of report %d: %s", ready.index, error)
            self.run_on_commit_thread(
                lambda: self._manager.delete_uncommitted([ready.dir_name]))
            self._broadcast(attempt, CommittedMessage(ready.index, None, skipped=True,
                                                      error=reason))
            self._events.emit(CommitFailed(ready, error, skipped=True))
            return
        if error is not None:
            attempt.failures.append(WorkerFailure(
                rank=min(ready.ranks), traceback="",
                summary=f"Commit of checkpoint {ready.dir_name} failed: {error}"))
            message = CommittedMessage(ready.index, None, error=f"commit failed: {error}")
            self._events.emit(CommitFailed(ready, error, skipped=False))
        else:
            assert outcome is not None
            attempt.last_commit_t = time.time()
            if result.holder is not None:
                attempt.tracker.mark_used(result.holder)
            message = CommittedMessage(ready.index, outcome.view)
            self._events.emit(CheckpointCommitted(
                Commit(t=time.time(), index=ready.index, seconds=outcome.seconds,
                       bytes=ready.bytes_uploaded),
                ready, outcome.view, outcome.seconds,
                checkpoint_from_view(outcome.view, self._run_config.storage_options())))
        self._broadcast(attempt, message)
