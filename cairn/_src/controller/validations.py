"""Validation of committed checkpoints, off the train loop, in the driver.

``report(..., validation=...)`` asks for the checkpoint of that report to be validated.
The controller hands it here once the checkpoint is handed to the commit; the runner
validates one checkpoint at a time, in report order, on its own thread
(``cairn-validation``), calling ``ValidationConfig.fn(checkpoint, **kwargs)`` on a
helper thread so that ``ValidationTaskConfig.timeout_s`` can be enforced (a validation
that passes it is reported ``VALIDATION_TIMEOUT``; Python cannot stop the thread, so it
runs to its end and its result is ignored).

Durability and ordering:

* the request is in the run's event log (``validation_requested``, flushed) before the
  checkpoint is committed, so a driver killed while it is pending runs it again on the
  next ``fit()`` (``validation_finished`` ends it). A ``fit()`` that ends before its
  validations finished (the run failed, Ctrl-C) leaves them pending the same way:
  :meth:`ValidationRunner.close` names them in one warning, and a result that comes later
  is dropped, never applied once the commit thread may have stopped;
* a request whose flush failed is withdrawn from the log: its report is never committed
  (``report_outcomes.not_handed_to_commit``), and a later report may commit a checkpoint
  of the same name. A request the log holds all the same (a crash before the flush that
  rewrites it away, or a log an older Cairn wrote) is ignored unless the checkpoint of
  that name was committed by the report that requested it;
* while pending, retention never deletes the checkpoint (:class:`ProtectPending` wraps
  the manager's policy);
* the result is applied on the commit thread (the checkpoint manager's only writer): the
  metrics are merged into the manifest and the index, retention runs again with them, and
  only then is ``validation_finished`` logged and the checkpoint's protection lifted.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cairn._src.checkpoint.index import CheckpointRecord
from cairn._src.checkpoint.manager import CheckpointManager
from cairn._src.checkpoint.reported import ReportedCheckpointStatus
from cairn._src.checkpoint.retention import RetentionPolicy
from cairn._src.checkpoint.views import ReadyCheckpoint, checkpoint_from_view
from cairn._src.config.validation import ValidationConfig, merged_task
from cairn._src.errors import ReportError
from cairn._src.observe.observer import EventStream
from cairn._src.run.events import Event, ValidationFinished, ValidationRequested, as_events
from cairn._src.run.report_checks import (
    check_merged_score,
    check_score_attribute,
    score_present,
    validate_metrics,
)
from cairn._src.storage.options import StorageOptions

logger = logging.getLogger(__name__)

REQUESTED = "validation_requested"
# How often fit(), waiting at its end for validations, says which ones it waits for.
WAIT_NOTE_S = 60.0
FINISHED = "validation_finished"


@dataclass(frozen=True)
class ProtectPending:
    """A retention policy that keeps every checkpoint whose validation is pending and,
    among the others, what ``inner`` keeps. A pending checkpoint takes none of the best-N
    places: its score may still change (the validation's metrics replace the reported
    ones), so it must not push a validated checkpoint out for good."""

    inner: RetentionPolicy
    pending: Callable[[], set[str]]

    def should_keep(self, records: Sequence[CheckpointRecord]) -> list[bool]:
        protected = self.pending()
        keep = [r.dir_name in protected for r in records]
        ranked = [i for i, k in enumerate(keep) if not k]
        for i, kept in zip(ranked, self.inner.should_keep([records[i] for i in ranked]),
                           strict=True):
            keep[i] = kept
        return keep


@dataclass(frozen=True)
class _Job:
    dir_name: str
    index: int
    task: dict[str, Any]


def _committed_by_request(job: _Job, committed: Mapping[str, int]) -> bool:
    """Whether the checkpoint ``job`` names is in the index (``committed``: name -> report
    index) as the checkpoint of the report that requested it. A request whose report
    never committed may name a checkpoint a later report committed (report indices only
    grow, so the later one's differs); a request logged without its report index (index
    0) is taken at its name."""
    index = committed.get(job.dir_name)
    return index is not None and job.index in (0, index)


class PendingValidations:
    """The validations of one run not finished yet, shared by the :class:`ValidationRunner`
    (which adds and finishes them) and the checkpoint manager's retention policy
    (:class:`ProtectPending` keeps :meth:`protected`). Thread-safe under :attr:`lock`."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        # Notified whenever a validation finishes, and when the runner closes.
        self.idle = threading.Condition(self.lock)
        self.jobs: dict[str, _Job] = {}
        # Pending, but no longer protected: their result is being applied (and re-ranked).
        self.applying: set[str] = set()
        # Validated, but the result could not be recorded (the manifest, the index or the
        # event log refused): no longer pending (fit() does not wait for them), but kept
        # for the rest of the run, so that the next fit() validates them again.
        self.unrecorded: set[str] = set()

    def protected(self) -> set[str]:
        """The checkpoints retention must keep."""
        with self.lock:
            return (set(self.jobs) - self.applying) | self.unrecorded


_STOP = object()


class ValidationRunner:
    """Runs the validations of one run (all its attempts). Thread-safe.

    ``submit(fn)`` runs ``fn`` on the controller's commit thread; ``wake()`` nudges the
    controller loop (a finished validation may answer ``get_all_reported_checkpoints``).
    """

    def __init__(self, config: ValidationConfig | None, manager: CheckpointManager,
                 events: EventStream, *, submit: Callable[[Callable[[], None]], None],
                 wake: Callable[[], None], options: StorageOptions,
                 pending: PendingValidations) -> None:
        self.config = config
        # The run's storage settings, given to the checkpoints the validations receive.
        self._options = options
        self._manager = manager
        self._events = events
        self._submit = submit
        self._wake = wake
        # Shared with the manager's retention policy (ProtectPending).
        self._pending = pending
        self._status: dict[str, ReportedCheckpointStatus] = {}
        # Validations of commits that failed, kept until the next attempt settles whether
        # the store wrote their index and lost its answer (adopted: they run after all).
        self._uncertain: dict[str, _Job] = {}
        self._jobs: queue.Queue[Any] = queue.Queue()
        self._thread: threading.Thread | None = None
        # Held while a result is handed to the commit thread, and by close(): a result is
        # either handed before close() returns (the commit thread applies it before it
        # stops) or not at all.
        self._handing = threading.Lock()
        # Set by close() (under _handing and the pending lock).
        self._closed = False
        # The validations whose result was handed to the commit thread and not yet
        # applied (under the pending lock).
        self._handed: set[str] = set()

    # --- state -------------------------------------------------------------------------

    def pending_names(self) -> set[str]:
        """The checkpoints retention must keep."""
        return self._pending.protected()

    def pending_up_to(self, index: int) -> bool:
        """Whether a validation of a report up to ``index`` will still finish in this run
        (without a validation config, those left by an earlier driver never do)."""
        with self._pending.lock:
            return self.config is not None and any(
                job.index <= index for job in self._pending.jobs.values())

    def status(self, dir_name: str) -> ReportedCheckpointStatus:
        with self._pending.lock:
            if dir_name in self._pending.jobs:
                return ReportedCheckpointStatus.PENDING_VALIDATION
            return self._status.get(dir_name, ReportedCheckpointStatus.COMMITTED)

    # --- requests ------------------------------------------------------------------------

    def resume(self, events: Iterable[Event | Mapping[str, Any]]) -> None:
        """Re-queue the validations a previous driver left pending (from the event log)."""
        requested: dict[str, _Job] = {}
        for event in as_events(events):
            if isinstance(event, ValidationRequested) and isinstance(event.dir_name, str):
                if event.task is not None:
                    requested[event.dir_name] = _Job(event.dir_name, int(event.index or 0),
                                                     event.task)
            elif isinstance(event, ValidationFinished) and isinstance(event.dir_name, str):
                name, status = event.dir_name, event.status
                requested.pop(name, None)
                if status is not None and status in ReportedCheckpointStatus.__members__:
                    with self._pending.lock:
                        self._status[name] = ReportedCheckpointStatus[status]
        committed = {r.dir_name: r.report_index for r in self._manager.index.checkpoints}
        jobs = sorted((j for j in requested.values() if _committed_by_request(j, committed)),
                      key=lambda j: j.index)
        if not jobs:
            return
        if self.config is None:
            logger.warning("Validations of %s are pending from an earlier driver, but this "
                           "Trainer has no validation_config: they stay pending",
                           [j.dir_name for j in jobs])
            with self._pending.lock:
                self._pending.jobs.update({j.dir_name: j for j in jobs})
            return
        logger.info("Running the validations an earlier driver left pending: %s",
                    [j.dir_name for j in jobs])
        for job in jobs:
            self._enqueue(job)

    def before_commit(self, ready: ReadyCheckpoint) -> None:
        """Record the request durably (before the checkpoint can exist) and protect it."""
        if ready.validation is None:
            return
        job = _Job(ready.dir_name, ready.index, dict(ready.validation))
        request = ValidationRequested(t=time.time(), dir_name=job.dir_name, index=job.index,
                                      task=job.task)
        self._events.emit(request)
        try:
            self._events.flush()
        except BaseException:
            # The caller does not commit this checkpoint: a later flush must not log the
            # request, or a later driver would take it as pending (for a checkpoint that
            # a retried report may commit under the same name).
            if not self._events.withdraw(request):
                logger.warning("The validation request of %s (report %d) was already "
                               "written to the event log; later drivers ignore it, as "
                               "that report is not committed", job.dir_name, job.index)
            raise
        with self._pending.lock:
            self._pending.jobs[job.dir_name] = job

    def after_commit(self, ready: ReadyCheckpoint, committed: bool) -> None:
        """Start the validation of a committed checkpoint; forget one that did not commit."""
        if ready.validation is None:
            return
        with self._pending.lock:
            job = self._pending.jobs.get(ready.dir_name)
            if not committed:
                dropped = self._pending.jobs.pop(ready.dir_name, None)
                if dropped is not None:
                    self._uncertain[ready.dir_name] = dropped
                self._pending.idle.notify_all()
                return
        if job is not None:
            self._enqueue(job)

    def settled(self, adopted: set[str]) -> None:
        """The failed commits were settled (``CheckpointManager.settle_uncertain``): the
        validations of those ``adopted`` as committed run; the others are forgotten."""
        with self._pending.lock:
            jobs, self._uncertain = self._uncertain, {}
        for name in sorted(adopted & set(jobs), key=lambda n: jobs[n].index):
            self._enqueue(jobs[name])

    def _enqueue(self, job: _Job) -> None:
        with self._pending.lock:
            self._pending.jobs[job.dir_name] = job
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="cairn-validation",
                                                daemon=True)
                self._thread.start()
        self._jobs.put(job)

    def wait_idle(self) -> None:
        """Block until no validation is pending (the end of a successful run), saying
        every :data:`WAIT_NOTE_S` which ones it waits for."""
        started = time.monotonic()
        note_at = started + WAIT_NOTE_S
        with self._pending.idle:
            while self._pending.jobs and self.config is not None:
                self._pending.idle.wait(min(1.0, WAIT_NOTE_S))
                now = time.monotonic()
                if self._pending.jobs and now >= note_at:
                    logger.warning(
                        "fit() has waited %.0fs for the validation of %s: a run ends once "
                        "its validations have finished, and a validation runs to its end "
                        "unless ValidationConfig(timeout_s=...) or report(validation="
                        "ValidationTaskConfig(timeout_s=...)) bounds it", now - started,
                        ", ".join(sorted(self._pending.jobs)))
                    note_at = now + WAIT_NOTE_S

    def close(self) -> None:
        """Stop the runner at the end of ``fit()``, also of a failed or interrupted one,
        before the commit thread stops. Does not wait for a validation.

        The validations not finished (running, queued) are named in one warning and stay
        pending: the run's event log holds their request and no result, so the next
        ``fit()`` of the run validates each of them once, and retention keeps their
        checkpoints meanwhile. A result already handed to the commit thread is applied
        there before it stops. The runner's thread hands nothing after this and ends
        once the validation function it waits for returns or passes its ``timeout_s``;
        the function runs on until it returns (Python cannot stop a thread) and its result
        is ignored. After a successful run nothing is pending: ``fit()`` waited for it
        (:meth:`wait_idle`)."""
        with self._handing, self._pending.idle:
            if self._closed:
                return
            self._closed = True
            abandoned = [] if self.config is None else sorted(
                (job for name, job in self._pending.jobs.items() if name not in self._handed),
                key=lambda job: job.index)
            # Ends the runner's wait for a result the commit thread may never apply.
            self._pending.idle.notify_all()
        self._jobs.put(_STOP)
        if abandoned:
            logger.warning(
                "fit() ended before these validations finished: %s. They stay pending "
                "validation, with no result recorded, and the next fit() of this run "
                "validates each of them once. A validation function still running runs on, "
                "on its driver thread, until it returns (Python cannot stop a thread); its "
                "result is ignored.", ", ".join(job.dir_name for job in abandoned))

    # --- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is _STOP or self._closed:
                return
            try:
                status, metrics = self._validate(job)
            except Exception:
                logger.exception("Validation of %s failed", job.dir_name)
                status, metrics = ReportedCheckpointStatus.VALIDATION_FAILED, {}
            done = threading.Event()
            with self._handing:
                if self._closed:
                    # fit() has ended: the commit thread may have stopped and the lease
                    # be released. close() named this validation; the next fit() runs it.
                    return
                with self._pending.lock:
                    self._handed.add(job.dir_name)
                self._submit(functools.partial(self._apply, job, status, metrics, done))
            # One at a time: the next validation starts after this one is applied. After
            # close() the commit thread may stop before it applies it: no wait then.
            with self._pending.idle:
                while not done.is_set() and not self._closed:
                    self._pending.idle.wait()

    def _validate(self, job: _Job) -> tuple[ReportedCheckpointStatus, dict[str, Any]]:
        assert self.config is not None
        record = self._manager.index.find(job.dir_name)
        if record is None:
            logger.warning("Not validating %s: it is no longer in the run index", job.dir_name)
            return ReportedCheckpointStatus.VALIDATION_FAILED, {}
        checkpoint = checkpoint_from_view(self._manager.view(record), self._options)
        kwargs, timeout = merged_task(self.config, job.task)
        box: list[Any] = []
        fn = self.config.fn

        def call() -> None:
            try:
                box.append(("ok", fn(checkpoint, **kwargs)))
            except BaseException as exc:
                box.append(("error", exc))

        worker = threading.Thread(target=call, name=f"cairn-validate-{job.dir_name}",
                                  daemon=True)
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            logger.warning("Validation of %s passed its timeout_s=%s; its result will be "
                           "ignored", job.dir_name, timeout)
            return ReportedCheckpointStatus.VALIDATION_TIMEOUT, {}
        outcome, value = box[0]
        if outcome == "error":
            logger.error("The validation function raised for %s: %s: %s", job.dir_name,
                         type(value).__name__, value)
            return ReportedCheckpointStatus.VALIDATION_FAILED, {}
        if not isinstance(value, Mapping):
            logger.error("The validation function returned %s for %s; it must return a dict "
                         "of metrics", type(value).__name__, job.dir_name)
            return ReportedCheckpointStatus.VALIDATION_FAILED, {}
        # The checks report() makes of metrics: a score retention cannot rank by (a
        # string) would otherwise re-rank the checkpoints with it (NaN ranks as the worst).
        name = getattr(fn, "__qualname__", None) or repr(fn)
        what = f"The validation function {name} returned metrics for {job.dir_name} that"
        try:
            metrics = validate_metrics(value, what=what)
            attribute = self._manager.config.checkpoint_score_attribute
            # Without the attribute the checkpoint keeps its reported score; with it (None
            # included) the score must be one retention can rank by.
            if attribute is not None and score_present(metrics, attribute):
                check_score_attribute(metrics, attribute, what=what)
            check_merged_score(record.metrics, metrics, attribute, what=what)
        except ReportError as exc:
            logger.error("%s The validation is VALIDATION_FAILED: its metrics are not "
                         "merged into %s, which keeps its reported metrics and its place "
                         "in retention; the run goes on.", exc, job.dir_name)
            return ReportedCheckpointStatus.VALIDATION_FAILED, {}
        return ReportedCheckpointStatus.VALIDATED, metrics

    def _apply(self, job: _Job, status: ReportedCheckpointStatus, metrics: dict[str, Any],
               done: threading.Event) -> None:
        """On the commit thread: merge, re-rank, log, then lift the protection."""
        dropped: tuple[CheckpointRecord, ...] = ()
        try:
            with self._pending.lock:
                # No longer protected: retention may now drop it, by its validated score.
                self._pending.applying.add(job.dir_name)
            dropped = self._manager.apply_validation(job.dir_name, metrics)
            self._events.emit(ValidationFinished(t=time.time(), dir_name=job.dir_name,
                                                 index=job.index, status=status.value,
                                                 metrics=metrics))
            self._events.flush()
            with self._pending.lock:
                self._status[job.dir_name] = status
            logger.info("Validation of %s: %s %s", job.dir_name, status.value, metrics)
        except Exception:
            logger.exception("Could not record the validation of %s; it is kept, and runs "
                             "again on the next fit()", job.dir_name)
            with self._pending.lock:
                self._pending.unrecorded.add(job.dir_name)
        finally:
            with self._pending.idle:
                self._pending.jobs.pop(job.dir_name, None)
                self._pending.applying.discard(job.dir_name)
                self._handed.discard(job.dir_name)
                done.set()
                self._pending.idle.notify_all()
            self._wake()
        self._manager.delete_dropped(dropped)
