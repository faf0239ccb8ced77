"""Cairn's exception hierarchy.

Every error Cairn raises derives from :class:`CairnError`; where a builtin exception fits,
the subclass also derives from it so that ``except FileNotFoundError`` keeps working.
Errors cross process boundaries (worker -> controller -> driver), so every class here must
pickle: they keep their constructor arguments in ``self.args``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cairn._src.run.status import ErrorInfo


class CairnError(Exception):
    """Root of every error raised by Cairn."""


class ConfigError(CairnError, ValueError):
    """A configuration or argument value is not accepted."""


class MetadataTypeError(ConfigError, TypeError):
    """``Checkpoint.set_metadata`` / ``update_metadata`` got metadata that is not a dict of
    JSON values with str keys. A ``TypeError`` too, as Ray Train raises for a value JSON
    cannot encode, so that a ported ``except TypeError`` catches it."""


class StorageError(CairnError, OSError):
    """A storage operation failed (after retries, where the error was transient)."""


class UnknownSchemeError(StorageError, ValueError):
    """A URI uses a scheme that no registered or installed storage backend handles."""


class CheckpointNotFoundError(StorageError, FileNotFoundError):
    """A checkpoint, or a file it names, does not exist."""


class NotADirectoryCheckpointError(StorageError, NotADirectoryError):
    """A path that must be a directory is a file."""


class CheckpointNotStoredError(StorageError):
    """Before a commit: the store does not hold every file it acknowledged writing, at the
    size written (a store that drops writes, or lists a short file)."""


class UnsafePathError(CairnError, ValueError):
    """A relative path inside a checkpoint would escape it (``..``, absolute, symlink)."""


class CheckpointDamagedError(StorageError):
    """What storage holds is not what Cairn committed there: the data is damaged.

    The root of every damage error that verification, restore and the readers of Cairn's
    own files raise. Resume treats each subclass as damage (the checkpoint is skipped and
    the previous one used); any other :class:`StorageError` is an outage, not damage.
    """


class ChecksumMismatchError(CheckpointDamagedError):
    """Data read back from storage does not match the size or checksum recorded at commit."""


class NotARegularFileError(ChecksumMismatchError):
    """A file a manifest lists is a symbolic link, a directory, a FIFO, a socket or a device.

    Cairn reads regular files only, so that a read can neither block nor follow a link
    out of the checkpoint.
    """


class MissingCheckpointFileError(CheckpointDamagedError, CheckpointNotFoundError):
    """A file that a committed checkpoint's manifest lists does not exist on storage."""


class ManifestError(CheckpointDamagedError):
    """A file Cairn reads back (a checkpoint manifest, the run index, a log record, the
    lease) is not valid JSON, has the wrong shape or an unknown version."""


class ReportError(CairnError, ValueError):
    """A ``report()`` call was made with arguments Cairn cannot accept."""


class OutsideWorkerError(ReportError, RuntimeError):
    """``report()``, ``get_checkpoint()``, ``get_context()`` (or another call that needs a
    worker) was made where no worker session answers: the driver, or one of its threads
    that run callbacks or validation functions. A ``RuntimeError`` too, as Ray Train
    raises there, so that a ported ``except RuntimeError`` catches it."""


# What a ReportError about a checkpoint file removed before its upload read it tells.
KEEP_UNTIL_UPLOADED = (
    "An ASYNC report() returns before the background upload reads the directory, so it "
    "must stay until the report's handle is done: write the checkpoint into "
    "tempfile.mkdtemp() (not a tempfile.TemporaryDirectory() block) and report it with "
    "delete_local_checkpoint_after_upload=True (the ASYNC default), which deletes it once "
    "uploaded; or call handle.wait() before deleting it yourself."
)


class CheckpointCollisionError(CairnError):
    """Two ranks tried to write the same relative path into one checkpoint."""


class CheckpointSkippedError(CairnError):
    """A checkpoint was dropped after its upload failed (``upload_failure_policy="skip"``)."""


class RunLeaseError(CairnError):
    """Another live driver holds the lease on this run."""


class CollectiveTimeoutError(CairnError, TimeoutError):
    """Ranks did not all reach the same report within the collective timeout."""


class AttemptStopped(BaseException):
    """Raised in the train function of a rank that Cairn keeps alive after another rank
    failed (``FailureConfig(keep_survivors=True)``), at its next ``report()`` or
    collective: the train function unwinds and is called again, in the same process, for
    the next attempt. It derives from ``BaseException`` so that ``except Exception`` in
    the train loop does not swallow it; let it propagate."""


class PlacementTimeoutError(CairnError, TimeoutError):
    """The Ray cluster did not place or start the workers within the placement timeout
    (``CAIRN_RAY_PLACEMENT_TIMEOUT_S``); the message names the resources it lacks and how
    to wait longer. The run stays resumable: ``fit()`` again continues it."""


class ConfigDeprecationError(CairnError, DeprecationWarning):
    """An argument Ray Train removed in its v2 API was passed.

    Raised, not warned, as Ray Train raises ``DeprecationWarning``: code written
    ``except DeprecationWarning`` or ``pytest.raises(DeprecationWarning)`` catches it. The
    message says what to do instead.
    """


class RunNotFoundError(CheckpointNotFoundError, RuntimeError):
    """A run directory does not exist, or is not a Cairn run.

    A ``RuntimeError`` as in Ray Train (``Result.from_path``), and a
    ``FileNotFoundError``.
    """


class ResultLookupError(CairnError, RuntimeError):
    """``Result.get_best_checkpoint`` has nothing to return: no checkpoints, or none with
    the metric asked for (a ``RuntimeError``, as in Ray Train)."""


class WorkerProcessError(CairnError, RuntimeError):
    """A worker failed without an exception from its train function: it exited, was
    killed, lost its connection, did not start, or did not keep up with the other ranks.

    Stands in ``WorkerGroupError.worker_failures`` for such ranks, and for an exception
    that could not be unpickled in the driver (its text and traceback are kept).
    """


class TrainingFailedError(CairnError):
    """``fit()`` failed for good: the failure budget is spent or the failure is fatal.

    Either a :class:`WorkerGroupError` (workers failed) or a :class:`ControllerError`
    (the driver failed, a callback included), as in Ray Train.
    """


class RunFailedError(TrainingFailedError):
    """The error of a failed run, read back from its event log (``Result.from_path``).

    The original exception lives only in the driver that raised it; this one carries what
    the log kept of it: ``error_type`` (its class's name, such as ``cairn.WorkerGroupError``),
    ``ranks`` / ``rank`` (the failed ranks, empty when the driver itself failed) and the
    message (bounded, with URIs redacted).
    """

    def __init__(self, message: str, *, error_type: str, ranks: tuple[int, ...] = (),
                 run_path: str | None = None) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.ranks = ranks
        self.rank = ranks[0] if ranks else None
        self.run_path = run_path

    def __reduce__(self) -> tuple[Any, ...]:
        return (_run_failed_error, (str(self), self.error_type, self.ranks, self.run_path))

    @classmethod
    def from_info(cls, info: ErrorInfo, run_path: str | None = None) -> RunFailedError:
        where = f"rank {info.rank}" if info.rank is not None else "the driver"
        head = f"{info.type} in {where}: " if info.type else f"{where}: "
        return cls(head + info.message, error_type=info.type, ranks=tuple(info.ranks),
                   run_path=run_path)


def _run_failed_error(message: str, error_type: str, ranks: tuple[int, ...],
                      run_path: str | None) -> RunFailedError:
    return RunFailedError(message, error_type=error_type, ranks=ranks, run_path=run_path)


class WorkerGroupError(TrainingFailedError):
    """One or more workers failed; the message groups ranks with their tracebacks.

    ``worker_failures`` maps each failed rank to its exception: the object the train
    function raised (unpickled from the worker), or a :class:`WorkerProcessError`.
    ``run_path``, when known, is where the run's committed checkpoints stay.
    """

    def __init__(
        self,
        error_message: str,
        worker_failures: dict[int, BaseException] | None = None,
        run_path: str | None = None,
    ) -> None:
        text = "Training failed due to worker errors:\n" + error_message
        if run_path:
            text += (f"\nThe run's committed checkpoints and metrics stay at {run_path} "
                     "(Result.from_path).")
        super().__init__(text)
        self.error_message = error_message
        self.worker_failures: dict[int, BaseException] = dict(worker_failures or {})
        self.run_path = run_path

    def __reduce__(self) -> tuple[type, tuple[str, dict[int, BaseException], str | None]]:
        return (self.__class__, (self.error_message, self.worker_failures, self.run_path))


class PreemptionError(TrainingFailedError):
    """Training was interrupted by node preemption more often than
    ``FailureConfig.max_preemption_failures`` allows (Ray Train's name).

    ``preemption_info`` is the last preemption's :class:`cairn.PreemptionInfo` (its nodes,
    ranks and deadline); ``drain_timed_out`` is True when Cairn tore the workers down at the
    deadline, False when they had already gone. ``detail`` says how the workers went;
    ``worker_failures`` maps each rank that failed to its error, as in
    :class:`WorkerGroupError`.
    """

    def __init__(self, preemption_info: Any, drain_timed_out: bool = False,
                 detail: str = "", run_path: str | None = None,
                 worker_failures: dict[int, BaseException] | None = None) -> None:
        ranks = getattr(preemption_info, "preempted_ranks", [])
        text = ("Training was interrupted by node preemption "
                f"(preempted_ranks={ranks}, drain_timed_out={drain_timed_out})")
        text += f": {detail}" if detail else "."
        if run_path:
            text += (f"\nThe run's committed checkpoints and metrics stay at {run_path} "
                     "(Result.from_path).")
        super().__init__(text)
        self.preemption_info = preemption_info
        self.drain_timed_out = drain_timed_out
        self.detail = detail
        self.run_path = run_path
        self.worker_failures: dict[int, BaseException] = dict(worker_failures or {})

    def __reduce__(self) -> tuple[type, tuple[Any, ...]]:
        return (self.__class__, (self.preemption_info, self.drain_timed_out, self.detail,
                                 self.run_path, self.worker_failures))


class ControllerError(TrainingFailedError):
    """The driver's side of the run failed, for example a callback raised.

    ``controller_failure`` is the original exception.
    """

    def __init__(self, controller_failure: BaseException) -> None:
        super().__init__("Training failed due to controller error:\n" + str(controller_failure))
        self.controller_failure = controller_failure

    def __reduce__(self) -> tuple[type, tuple[BaseException]]:
        return (self.__class__, (self.controller_failure,))
