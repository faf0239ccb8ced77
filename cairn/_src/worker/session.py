"""The worker side of a run: ``report()``, ``get_checkpoint()`` and ``get_context()``.

The user's function runs on the worker's main thread. Around it:

* a receiver thread reads the controller's answers and resolves waiters; when the
  controller's connection drops (the driver died), the worker exits at once;
* an uploader thread runs ASYNC uploads one report after another (each with parallel file
  transfers), at most ``max_pending_uploads`` queued, beyond which ``report()`` waits.

Metric-only reports are one message on the socket: they never wait for other ranks or the
controller. A kept rank's memory copy of its checkpoint is :mod:`.memory_copy`'s."""

from __future__ import annotations

import logging
import os
import queue
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from multiprocessing.connection import Connection
from typing import Any

from cairn._src.checkpoint.checkpoint import Checkpoint
from cairn._src.checkpoint.local_tier import LocalTier
from cairn._src.checkpoint.references import check_upload_source
from cairn._src.checkpoint.reported import CheckpointConsistencyMode, ReportedCheckpoint
from cairn._src.checkpoint.views import CheckpointView, checkpoint_from_view
from cairn._src.config.run import CheckpointUploadMode
from cairn._src.errors import AttemptStopped, CairnError, CheckpointSkippedError, ReportError
from cairn._src.run.layout import default_checkpoint_dir_name
from cairn._src.run.report_checks import check_dir_name, check_score_attribute, validate_metrics
from cairn._src.storage.options import StorageOptions
from cairn._src.storage.paths import check_relative_path, local_dir_identity
from cairn._src.storage.retry import RetryPolicy
from cairn._src.wire.datasets import DatasetShards
from cairn._src.wire.messages import (
    CheckpointIntent,
    CollectiveReleaseMessage,
    CommittedMessage,
    ProceedMessage,
    RejectMessage,
    RejoinMessage,
    ReportedCheckpointsReply,
    ReportMessage,
    SetupMessage,
    StopMessage,
    StoppedMessage,
    TimingMessage,
    UploadedMessage,
    driver_copy_limit,
)
from cairn._src.wire.preemption import PreemptionMessage
from cairn._src.wire.sockets import receive
from cairn._src.worker.collectives import WorkerCollectives
from cairn._src.worker.context import TrainContext
from cairn._src.worker.direct_write import direct_writer, write_direct
from cairn._src.worker.memory_copy import MemoryCopies, RestoreSources, serve_copy
from cairn._src.worker.peer_prefetch import restore_sources
from cairn._src.worker.preemption import WorkerPreemption
from cairn._src.worker.references import reference_intent, reference_location
from cairn._src.worker.report_handle import ReportHandle
from cairn._src.worker.reported_client import ReportedCheckpointsClient
from cairn._src.worker.session_owner import driver_thread_runs, outside_worker
from cairn._src.worker.upload_errors import upload_failure
from cairn._src.worker.upload_job import (
    BACKGROUND_NICENESS,
    UploadFn,
    UploadJob,
    Waiter,
    checkpoint_files,
    deferred_directory,
    delete_after_upload,
    delete_source,
    is_local_source,
    lower_thread_priority,
    resolve_after_commit,
    unchanged_files,
    upload_files,
    upload_with_function,
    validation_task,
    write_deferred,
)

__all__ = ["BACKGROUND_NICENESS", "UploadFn", "WorkerSession", "get_session",
           "lower_thread_priority", "set_session", "unchanged_files"]

logger = logging.getLogger(__name__)

_STOP = object()


class WorkerSession:
    """State of one worker process for one attempt. Created by ``worker.main``."""

    def __init__(self, connection: Connection, setup: SetupMessage, retry: RetryPolicy, *,
                 on_controller_lost: Callable[[], None] | None = None,
                 memory: MemoryCopies | None = None) -> None:
        self._connection = connection
        # Called when the controller's connection drops mid-run; None: exit the process.
        self._on_controller_lost = on_controller_lost
        self._setup = setup
        self.retry = retry
        self.rank = setup.rank
        self.context = TrainContext.for_setup(setup)
        self.datasets = DatasetShards(setup.dataset_names, setup.dataset_shards)
        # This node's copy of the newest committed checkpoint (None: off), restored from.
        self._tier = LocalTier.for_run(setup.run, setup.local_tier_dir, setup.local_tier_bytes)
        # keep_survivors: this process's memory copies (report_snapshot's are shared).
        self.memory = memory
        # keep_survivors: a replacement rank's peer transfer starts in there, now.
        self._copies = restore_sources(setup, memory, self._tier, self.send, retry)
        self.storage_options = StorageOptions(transfer=setup.transfer, retry=retry,
                                              fsync=setup.fsync, local_tier=self._copies)
        self._send_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._next_index = setup.first_report_index
        self._latest: CheckpointView | None = setup.resume
        self._proceed: dict[int, Waiter] = {}
        self._handles: dict[int, ReportHandle] = {}
        self._async_error: BaseException | None = None
        self._uploads: queue.Queue[Any] = queue.Queue()
        self._slots = threading.Semaphore(setup.max_pending_uploads)
        self._stopping = False
        # keep_survivors: the controller's stop, then its RejoinMessage (or None).
        self._stop: AttemptStopped | None = None
        self._rejoin: RejoinMessage | None = None
        self._stop_event, self._rejoin_event = threading.Event(), threading.Event()
        # Set once the train function ended: only then does the connection's end let go.
        self._rejoining = threading.Event()
        self.collectives = WorkerCollectives(self.rank, self.send, lambda: self.report_count)
        self.preemption = WorkerPreemption()  # what get_preemption_info() hands out
        self.reproducibility_seed: int | None = None  # enable_reproducibility's, this attempt
        self._reported = ReportedCheckpointsClient(self.rank, self.send,
                                                   lambda: self._next_index - 1,
                                                   self.storage_options)
        self._receiver = threading.Thread(target=self._receive, name="cairn-receiver", daemon=True)
        self._receiver.start()
        self._uploader = threading.Thread(target=self._upload_loop, name="cairn-uploader",
                                          daemon=True)
        self._uploader.start()

    # --- the public API ----------------------------------------------------------------------

    def get_checkpoint(self) -> Checkpoint | None:
        with self._state_lock:
            view = self._latest
        return self._checkpoint(view) if view is not None else None

    def _checkpoint(self, view: CheckpointView) -> Checkpoint:
        """The checkpoint of ``view`` as the train function gets it: restored with this
        run's storage options (its local tier included)."""
        return checkpoint_from_view(view)._with_options(self.storage_options)

    def report(
        self,
        metrics: object,
        checkpoint: Checkpoint | None = None,
        *,
        checkpoint_dir_name: str | None = None,
        checkpoint_upload_mode: object = CheckpointUploadMode.SYNC,
        delete_local_checkpoint_after_upload: bool | None = None,
        checkpoint_upload_fn: UploadFn | None = None,
        validation: object = False,
    ) -> ReportHandle:
        self._raise_async_error()
        clean = validate_metrics(metrics)
        mode = CheckpointUploadMode.parse(checkpoint_upload_mode)
        task = validation_task(validation, checkpoint, enabled=self._setup.validation)
        if checkpoint is None:
            # A name without a checkpoint is accepted, as in Ray Train: another rank may pass
            # the checkpoint of this report; the controller checks that the names agree.
            if checkpoint_dir_name is not None:
                check_dir_name(checkpoint_dir_name)
            index = self._take_index()
            self.send(ReportMessage(self.rank, index, clean, None, time.time(),
                                    dir_name=checkpoint_dir_name))
            return ReportHandle(index, has_checkpoint=False)
        return self._report_checkpoint(clean, checkpoint, checkpoint_dir_name, mode,
                                       delete_local_checkpoint_after_upload,
                                       checkpoint_upload_fn, task)

    def get_all_reported_checkpoints(
        self, consistency_mode: object = CheckpointConsistencyMode.VALIDATED,
        timeout_s: object = None,
    ) -> list[ReportedCheckpoint]:
        return self._reported.get_all(consistency_mode, timeout_s)

    # --- checkpoint reports ----------------------------------------------------------------

    def _report_checkpoint(self, metrics: dict[str, Any], checkpoint: Checkpoint,
                           dir_name: str | None, mode: CheckpointUploadMode,
                           delete_local: bool | None, upload_fn: UploadFn | None,
                           validation: dict[str, Any] | None = None) -> ReportHandle:
        if not isinstance(checkpoint, Checkpoint):
            raise ReportError(
                f"report(checkpoint={checkpoint!r}) must be a cairn.Checkpoint or None, not "
                f"{type(checkpoint).__name__}. Wrap a directory with "
                "Checkpoint.from_directory(path)."
            )
        if mode is not CheckpointUploadMode.NO_UPLOAD:
            check_upload_source(checkpoint.location, self._setup.run,
                                what=f"report(checkpoint={checkpoint!r})")
        if validation is None and self.rank == 0:
            # A checkpoint keeps rank 0's metrics; a validation may give the score.
            check_score_attribute(metrics, self._setup.score_attribute)
        if dir_name is not None:
            check_dir_name(dir_name)
        if upload_fn is not None and not callable(upload_fn):
            raise ReportError(
                f"report(checkpoint_upload_fn={upload_fn!r}) must be a callable "
                "(checkpoint, checkpoint_dir_name) -> Checkpoint."
            )
        if delete_local is not None and not isinstance(delete_local, bool):
            raise ReportError(
                f"report(delete_local_checkpoint_after_upload={delete_local!r}) must be True, "
                "False or None."
            )
        if mode is CheckpointUploadMode.NO_UPLOAD:
            return self._register_reference(metrics, checkpoint, dir_name, validation)
        files: dict[str, int] = {}
        metadata: dict[str, Any] = {}
        if upload_fn is None:
            files, has_metadata = checkpoint_files(checkpoint, self.retry)
            if has_metadata:
                metadata = checkpoint.get_metadata()
        else:  # the metadata of the checkpoint given to the function, as NO_UPLOAD's
            metadata = checkpoint.get_metadata()
        index = self._take_index()
        name = dir_name or default_checkpoint_dir_name(index)
        handle = ReportHandle(index, has_checkpoint=True)
        job = UploadJob(
            index=index,
            dir_name=name,
            checkpoint=checkpoint,
            files=files,
            upload_fn=upload_fn,
            delete_local=delete_after_upload(delete_local, mode is CheckpointUploadMode.ASYNC,
                                             checkpoint),
            handle=handle,
            metadata=metadata,
            validation=validation,
            source=local_dir_identity(checkpoint.path)
            if upload_fn is None and is_local_source(checkpoint) else None,
        )
        if job.delete_local and upload_fn is None:
            # Deleted once the report committed, before the caller's handle says so: not
            # before (another rank may still read or write this same directory), and not
            # when the report is refused or skipped (the user's only copy).
            job.inner = ReportHandle(index, has_checkpoint=True)
        if mode is CheckpointUploadMode.ASYNC:
            job.background = True
            return self._enqueue(job, metrics)
        started = time.perf_counter()
        self._announce(job, metrics, mode)
        try:
            self._run_upload(job)
            (job.inner or handle).wait()
        except CheckpointSkippedError:
            pass  # upload_failure_policy="skip": training goes on without this checkpoint
        finally:
            self._end_job(job)
        self._timing("checkpoint_stall", time.perf_counter() - started, index)
        return handle

    def _enqueue(self, job: UploadJob, metrics: dict[str, Any]) -> ReportHandle:
        started = time.perf_counter()
        # Back-pressure: a free slot first, then the report goes out in order.
        self._slots.acquire()
        stall = time.perf_counter() - started
        self._announce(job, metrics, CheckpointUploadMode.ASYNC)
        self._uploads.put(job)
        self._timing("checkpoint_stall", stall, job.index)
        return job.handle

    def report_deferred(
        self,
        metrics: object,
        *,
        files: Iterable[str],
        write: Callable[[str], None],
        checkpoint_dir_name: str | None = None,
    ) -> ReportHandle:
        """An ASYNC checkpoint report whose files are written later, off the train loop.

        ``files`` names the relative paths ``write(directory)`` will create, claimed at
        once (rank collisions are caught now); ``write`` runs on the upload thread:
        straight into storage (:mod:`.direct_write`), or into a private temporary
        directory that is uploaded, then deleted. It must get data never modified (a copy).
        """
        self._raise_async_error()
        clean = validate_metrics(metrics)
        if self.rank == 0:  # as report(): a checkpoint keeps rank 0's metrics
            check_score_attribute(clean, self._setup.score_attribute)
        if checkpoint_dir_name is not None:
            check_dir_name(checkpoint_dir_name)
        declared = {check_relative_path(name, argument="files"): 0 for name in files}
        if not declared:
            raise ReportError("report_deferred(files=...) must name at least one file.")
        directory = deferred_directory()  # created only if the upload needs it
        index = self._take_index()
        job = UploadJob(
            index=index, dir_name=checkpoint_dir_name or default_checkpoint_dir_name(index),
            checkpoint=Checkpoint.from_directory(directory), files=declared, upload_fn=None,
            delete_local=True, handle=ReportHandle(index, has_checkpoint=True), metadata={},
            write=write)
        return self._enqueue(job, clean)

    def _register_reference(self, metrics: dict[str, Any], checkpoint: Checkpoint,
                            dir_name: str | None,
                            validation: dict[str, Any] | None = None) -> ReportHandle:
        location = reference_location(checkpoint, self._setup.run, self.retry)
        index = self._take_index()
        handle = ReportHandle(index, has_checkpoint=True)
        with self._state_lock:
            if self._stop is not None:  # else nothing would ever resolve its handle
                raise self._stop
            self._handles[index] = handle
        name = dir_name or default_checkpoint_dir_name(index)
        intent = reference_intent(checkpoint, location, name, dir_name, validation)
        self.send(ReportMessage(self.rank, index, metrics, intent, time.time()))
        return handle

    def _announce(self, job: UploadJob, metrics: dict[str, Any],
                  mode: CheckpointUploadMode) -> None:
        waiter = Waiter()
        with self._state_lock:
            if self._stop is not None:
                raise self._stop
            self._proceed[job.index] = waiter
            self._handles[job.index] = job.inner or job.handle
        intent = CheckpointIntent(job.dir_name, mode.value, files=job.files,
                                  explicit_dir_name=job.dir_name
                                  != default_checkpoint_dir_name(job.index),
                                  metadata=job.metadata, upload_fn=job.upload_fn is not None,
                                  validation=job.validation, source=job.source)
        self.send(ReportMessage(self.rank, job.index, metrics, intent, time.time()))

    def _run_upload(self, job: UploadJob) -> None:
        """Wait for the go-ahead, upload, announce; the commit resolves ``job.handle``."""
        with self._state_lock:
            waiter = self._proceed[job.index]
        answer = waiter.get()  # the waiter stays until the job ends (_end_job)
        if isinstance(answer, RejectMessage):
            if job.write is not None:
                shutil.rmtree(job.checkpoint.path, ignore_errors=True)
            self._fail_handle(job.index, answer.error)
            if isinstance(answer.error, CheckpointSkippedError):
                return  # another rank's part failed to upload; the report is skipped
            raise answer.error
        destination = self._setup.run.join(job.dir_name)
        started = time.perf_counter()
        policy = self._setup.upload_failure_policy
        try:
            if job.upload_fn is not None:
                message = upload_with_function(job, self.rank, started,
                                               self.storage_options, run=self._setup.run)
            elif isinstance(answer, ProceedMessage) and answer.shared == "skip":
                # Another rank reported this same directory and uploads it whole.
                message = UploadedMessage(self.rank, job.index, {}, None, 0, 0.0)
            elif (writer := direct_writer(job, self._tier)) is not None:
                message = write_direct(job, writer, answer, destination, self.rank, started,
                                       options=self.storage_options, keep=self.memory,
                                       small_limit=driver_copy_limit(self._setup.world_size))
            else:
                if job.write is not None:
                    write_deferred(job)
                message = upload_files(job, answer, destination, self.rank, started,
                                       options=self.storage_options, policy=policy,
                                       list_files=lambda: checkpoint_files(
                                           job.checkpoint, self.retry)[0])
        except BaseException as caught:
            if job.write is not None:
                shutil.rmtree(job.checkpoint.path, ignore_errors=True)
            failure = upload_failure(self.rank, job.index, job.checkpoint.path, caught,
                                     removable=job.removable, policy=policy)
            if failure.fatal is not None:
                self.send(failure.fatal)  # a restart repeats it
            exc = failure.error
            self.send(failure.failed)
            if policy == "skip" and isinstance(exc, Exception):
                logger.warning("Skipping the checkpoint of report %d: its upload failed after "
                               "retries: %s", job.index, exc)
                self._fail_handle(job.index, CheckpointSkippedError(
                    f"The checkpoint of report {job.index} was skipped: {exc}"))
                return
            self._fail_handle(job.index, exc)
            if exc is not caught:
                raise exc from caught
            raise
        if self._tier is not None and message.entries and is_local_source(job.checkpoint):
            # Before the local copy may go: the files this worker uploaded, as uploaded.
            self._tier.add(job.index, job.dir_name, job.checkpoint.path, message.entries)
        if (job.delete_local and job.inner is None and not job.vanished
                and message.reference != job.checkpoint.location):
            # On storage now, not needed for the commit. A directory an upload function
            # registered in place (torch DCP writing straight to its final location)
            # stays, and so does one whose upload may yet fail (files vanished).
            delete_source(job.checkpoint, self.retry)
        job.sent = True
        self.send(message)

    def _upload_loop(self) -> None:
        lower_thread_priority()
        while True:
            job = self._uploads.get()
            if job is _STOP:
                return
            try:
                self._run_upload(job)
                (job.inner or job.handle).wait()
            except (CheckpointSkippedError, AttemptStopped):
                pass
            except BaseException as exc:
                with self._state_lock:
                    if self._async_error is None:
                        self._async_error = exc
                logger.error("ASYNC checkpoint upload of report %d failed: %s", job.index, exc)
            finally:
                self._end_job(job)
                self._slots.release()

    def _end_job(self, job: UploadJob) -> None:
        """The job is over; its waiter stayed until now, so that a refusal coming after the
        upload (a collision found once every part was uploaded) only fails the handle the
        job waits on, not also the next report(), as a NO_UPLOAD report's (no job) does."""
        with self._state_lock:
            self._proceed.pop(job.index, None)
        resolve_after_commit(job, self.retry)

    def _fail_handle(self, index: int, error: BaseException) -> None:
        with self._state_lock:
            handle = self._handles.pop(index, None)
        if handle is not None:
            handle._resolve(None, error)

    def _raise_async_error(self) -> None:
        with self._state_lock:
            if self._stop is not None:
                raise self._stop
            error, self._async_error = self._async_error, None
        if error is not None:
            raise error

    # --- plumbing --------------------------------------------------------------------------

    def _take_index(self) -> int:
        with self._state_lock:
            index = self._next_index
            self._next_index += 1
        return index

    @property
    def report_count(self) -> int:
        return self._next_index - self._setup.first_report_index

    def send(self, message: object) -> None:
        with self._send_lock:
            self._connection.send(message)

    def _timing(self, kind: str, seconds: float, index: int | None = None) -> None:
        self.send(TimingMessage(self.rank, kind, seconds, time.time(), index))

    def _receive(self) -> None:
        while True:
            try:
                message = receive(self._connection)
            except (EOFError, OSError):
                if not (self._stopping or self._rejoining.is_set()):
                    # The controller is gone (driver killed): nobody will commit or answer;
                    # leave now rather than train on unobserved (local mode: stop the function).
                    (self._on_controller_lost or (lambda: os._exit(70)))()
                # No answer comes now: every wait ends; a kept rank lets go (the group restarts).
                self._on_stop(StopMessage(self._setup.attempt, "the controller connection ended"))
                self._rejoin_event.set()
                return
            if isinstance(message, ProceedMessage | RejectMessage):
                with self._state_lock:
                    waiter = self._proceed.get(message.index)  # None: no upload job
                    if (waiter is None and isinstance(message, RejectMessage)
                            and not isinstance(message.error, CheckpointSkippedError)
                            and self._async_error is None):
                        # Nobody waits on a refused NO_UPLOAD report: the error is raised
                        # at this rank's next report() or when its function returns.
                        self._async_error = message.error
                if waiter is not None:
                    waiter.set(message)
                if isinstance(message, RejectMessage):
                    self._fail_handle(message.index, message.error)
            elif isinstance(message, CommittedMessage):
                self._on_committed(message)
            elif isinstance(message, CollectiveReleaseMessage):
                self.collectives.on_release(message)
            elif isinstance(message, ReportedCheckpointsReply):
                self._reported.on_reply(message)
            elif isinstance(message, StopMessage):
                self._on_stop(message)
            elif isinstance(message, RejoinMessage):
                self._rejoin, self._stopping = message, True
                self._rejoin_event.set()
                return
            elif isinstance(message, PreemptionMessage):
                self.preemption.on_message(message)

    def _on_committed(self, message: CommittedMessage) -> None:
        for copies in (self._copies, self.memory) if message.checkpoint is not None else ():
            if copies is not None and message.checkpoint is not None:
                copies.committed(message.checkpoint.report_index)
        with self._state_lock:
            if message.checkpoint is not None and (
                self._latest is None or message.checkpoint.report_index
                > self._latest.report_index
            ):
                self._latest = message.checkpoint
            handle = self._handles.pop(message.index, None)
            waiter = self._proceed.get(message.index)
        error = (CheckpointSkippedError(message.error or "skipped") if message.skipped
                 else CairnError(message.error) if message.error is not None else None)
        if waiter is not None and error is not None:
            # Resolved before this rank's verdict came (held for a shared directory when
            # another rank's upload failed): its job ends, uploading nothing.
            waiter.set(RejectMessage(message.index, error), final=True)
        if handle is None:
            return
        if error is not None:
            handle._resolve(None, error)
        else:
            view = message.checkpoint
            handle._resolve(self._checkpoint(view) if view else None, None)

    def finish(self) -> None:
        """Wait until every ASYNC upload of this worker has committed, then stop threads."""
        self._uploads.put(_STOP)
        self._uploader.join()
        with self._state_lock:
            pending = list(self._handles.values())
        for handle in pending:
            handle.wait()
        self._raise_async_error()

    def close(self) -> None:
        self._stopping = True
        self._uploads.put(_STOP)  # after a failure too: local mode's process goes on
        if isinstance(self._copies, RestoreSources):
            self._copies.close()  # a peer transfer that no restore took: its files go

    def join(self, *, receiver: bool = True) -> None:
        """Wait for the uploader (after close(): its queued uploads) and the receiver."""
        if receiver:
            self._receiver.join()
        self._uploader.join()

    def _on_stop(self, message: StopMessage) -> None:
        """Another rank failed and this one survives (``keep_survivors``; the receiver
        thread): every wait of the train function and the uploader, and its next report()
        or collective, raise AttemptStopped."""
        stop = AttemptStopped(f"attempt {message.attempt} is stopping: {message.reason}")
        with self._state_lock:
            self._stop = self._stop or stop
            waiters, handles = list(self._proceed.items()), list(self._handles.values())
            self._handles.clear()
        for index, waiter in waiters:
            waiter.set(RejectMessage(index, stop))
        for handle in handles:
            handle._resolve(None, stop)
        self._reported.stop(stop)
        self.collectives.stop(stop)
        self._stop_event.set()

    def wait_to_rejoin(self, attempt: int) -> RejoinMessage | None:
        """After the train function ended: wait for the stop, let the uploader finish, say
        so, and wait for the next attempt (None: the controller let this process go)."""
        self._stop_event.wait()
        self._rejoining.set()
        self._uploads.put(_STOP)
        self._uploader.join()
        if not self._rejoin_event.is_set():
            try:
                self.send(StoppedMessage(self.rank, attempt, serve_copy(self.memory)))
            except OSError:
                return None
        self._rejoin_event.wait()
        self._stopping = True
        return self._rejoin


_session: WorkerSession | None = None


def set_session(session: WorkerSession | None) -> None:
    global _session
    _session = session


def get_session(function: str) -> WorkerSession:
    """This process's session for ``cairn.<function>()``; see :mod:`.session_owner`."""
    if _session is None or driver_thread_runs() is not None:
        raise outside_worker(function)
    return _session
