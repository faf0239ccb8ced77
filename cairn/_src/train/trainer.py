"""``Trainer``: runs a training function on N workers with checkpoints and restarts."""

from __future__ import annotations

import errno
import inspect
import logging
import os
import secrets
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn, TypedDict

from cairn._src import migration
from cairn._src.checkpoint.manager import CheckpointManager
from cairn._src.checkpoint.opening import open_run
from cairn._src.config.data import DataConfig
from cairn._src.config.run import RunConfig, ScalingConfig, default_storage_path
from cairn._src.config.validation import ValidationConfig
from cairn._src.controller.assembly import build_controller, build_manager, build_observers
from cairn._src.controller.payload import TrainSpec
from cairn._src.controller.validations import PendingValidations
from cairn._src.errors import (
    CheckpointDamagedError,
    CheckpointNotFoundError,
    ConfigDeprecationError,
    ConfigError,
    ControllerError,
    StorageError,
    TrainingFailedError,
)
from cairn._src.observe.callbacks import call_hooks
from cairn._src.run.layout import EVENTS_DIR, INDEX_NAME, METRICS_DIR, nearest_marked
from cairn._src.run.lease import RunLease
from cairn._src.run.ray_train_dir import refuse_ray_train_run
from cairn._src.run.segment_log import SegmentLog, read_log
from cairn._src.storage.durability import fsync_path
from cairn._src.storage.location import (
    StorageLocation,
    check_picklable,
    check_uri_typo,
    resolve,
)
from cairn._src.storage.reader import local_os_path
from cairn._src.storage.retry import RetryPolicy
from cairn._src.storage.uris import scheme_of
from cairn._src.train.local_mode import DriverRun, in_process_backend, local_run_config
from cairn._src.train.pickling import check_config_picklable, check_train_fn_picklable
from cairn._src.train.result import Result, build_result
from cairn._src.wire.datasets import (
    check_dataset_config,
    check_datasets,
    current_data_context,
)

logger = logging.getLogger(__name__)


def _takes_config(fn: Callable[..., Any]) -> bool:
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return True
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    keyword_only = [p.name for p in parameters
                    if p.kind is p.KEYWORD_ONLY and p.default is p.empty]
    if keyword_only:
        # Each worker calls fn(config) or fn(): a required keyword-only parameter would
        # fail there with a TypeError, on every restart.
        raise ConfigError(
            f"train_loop_per_worker={getattr(fn, '__name__', fn)!r} has the required "
            f"keyword-only parameter {keyword_only[0]!r}; it is called with the "
            "train_loop_config as its one positional argument, or with none: make that "
            "parameter positional (def train_func(config)) or give it a default."
        )
    if any(p.kind is p.VAR_POSITIONAL for p in parameters):
        return True
    required = [p for p in positional if p.default is p.empty]
    if len(required) > 1:
        raise ConfigError(
            f"train_loop_per_worker={getattr(fn, '__name__', fn)!r} takes {len(required)} "
            "required arguments; it must take no argument or one (the train_loop_config)."
        )
    return bool(positional)


class TrainerOptions(TypedDict, total=False):
    """The keyword arguments of :class:`Trainer` (``TorchTrainer`` takes them too)."""

    train_loop_config: dict[str, Any] | None
    scaling_config: ScalingConfig | None
    run_config: RunConfig | None
    validation_config: ValidationConfig | None
    datasets: dict[str, Any] | None
    dataset_config: DataConfig | None
    resume_from_checkpoint: object
    metadata: object


TRAINER_OPTIONS = frozenset(TrainerOptions.__annotations__)


class Trainer:
    """Runs ``train_loop_per_worker`` on ``scaling_config.num_workers`` processes.

    ``fit()`` blocks until the run finishes and returns its :class:`Result`. A worker that
    fails restarts the whole group (up to ``FailureConfig.max_failures``) from the latest
    committed checkpoint. Calling ``fit()`` again with the same ``RunConfig.name`` and
    ``storage_path`` continues the run. When the run fails for good, ``fit()`` raises
    :class:`TrainingFailedError`; ``Result.from_path`` still reads what was committed.
    """

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        train_loop_config: dict[str, Any] | None = None,
        scaling_config: ScalingConfig | None = None,
        run_config: RunConfig | None = None,
        validation_config: ValidationConfig | None = None,
        datasets: dict[str, Any] | None = None,
        dataset_config: DataConfig | None = None,
        resume_from_checkpoint: object = None,
        metadata: object = None,
    ) -> None:
        # Arguments Ray Train v2 removed: refused with Ray's migration hint, as Ray does.
        if resume_from_checkpoint is not None:
            raise ConfigDeprecationError(migration.RESUME_FROM_CHECKPOINT)
        if metadata is not None:
            raise ConfigDeprecationError(migration.GET_METADATA)
        if not callable(train_loop_per_worker):
            raise ConfigError(
                f"train_loop_per_worker={train_loop_per_worker!r} must be a function."
            )
        self._pass_config = _takes_config(train_loop_per_worker)
        if train_loop_config is not None and not isinstance(train_loop_config, dict):
            raise ConfigError(
                f"train_loop_config={train_loop_config!r} must be a dict or None."
            )
        if scaling_config is not None and not isinstance(scaling_config, ScalingConfig):
            raise ConfigError(f"scaling_config={scaling_config!r} must be a ScalingConfig.")
        if scaling_config is None or not scaling_config.local_mode:
            # Pickled for the workers when fit() starts them: what cannot be is named here.
            # Local mode runs them in the driver, as they are (as Ray's local mode does).
            check_train_fn_picklable(train_loop_per_worker)
            if train_loop_config is not None:
                check_config_picklable(train_loop_config)
        if run_config is not None and not isinstance(run_config, RunConfig):
            raise ConfigError(f"run_config={run_config!r} must be a RunConfig.")
        if validation_config is not None and not isinstance(validation_config,
                                                            ValidationConfig):
            raise ConfigError(
                f"validation_config={validation_config!r} must be a cairn.ValidationConfig or "
                "None."
            )
        # Runs in the driver (report(validation=...)); it never travels to the workers.
        self.validation_config = validation_config
        self.train_loop_per_worker = train_loop_per_worker
        self.train_loop_config = train_loop_config
        self.scaling_config = scaling_config or ScalingConfig()
        self.run_config = run_config or RunConfig()
        # Ray Data datasets, split per attempt into one shard per worker (either backend),
        # as the DataConfig says; Ray Data's settings are those in force now, as in Ray.
        self.datasets = check_datasets(datasets)
        self.data_config = check_dataset_config(dataset_config, self.datasets)
        self._data_context = current_data_context() if self.datasets else None
        # Extension points for framework trainers (cairn.torch.TorchTrainer): run in every
        # worker before / after the train function, and environment per attempt.
        self._setup_hooks: list[Callable[[Any], None]] = []
        self._teardown_hooks: list[Callable[[Any], None]] = []
        self._attempt_env: Callable[[int], dict[str, str]] | None = None
        # A run without a name gets a unique one: trainers built in a loop never share a
        # run (and so never continue each other's).
        self._run_name = self.run_config.name or (
            time.strftime("cairn_%Y-%m-%d_%H-%M-%S_") + secrets.token_hex(3))
        self._storage_path = _absolute_storage_path(
            self.run_config.storage_path or default_storage_path(),
            self.run_config.storage_filesystem)

    def _run_location(self) -> StorageLocation:
        """The run directory; checks once that the storage can reach the workers, and that
        on local storage the run directory lies inside no other run's directory."""
        filesystem = self.run_config.storage_filesystem
        if filesystem is not None:
            check_picklable(filesystem, argument="RunConfig.storage_filesystem")
        base = resolve(self._storage_path, filesystem)
        if base.in_process:
            given = (f"storage_filesystem={filesystem!r}" if filesystem is not None
                     else f"storage_path={base.display()!r}")
            raise ConfigError(
                f"RunConfig({given}) is an in-process store: every worker process (and a "
                "restarted driver) would see an empty store of its own. Use a local "
                "directory (storage_path='/tmp/runs', or tempfile.mkdtemp() in tests), a "
                "remote URI such as 's3://bucket/runs', or a store that lives outside this "
                "process, given as storage_filesystem or through a URI scheme registered "
                "with cairn.storage.register_scheme()."
            )
        run = base.join(self._run_name)
        path = local_os_path(run)
        directory = os.path.abspath(path) if path is not None else None
        outer = _enclosing_run(directory) if directory is not None else None
        if outer is not None:
            raise ConfigError(
                f"RunConfig(storage_path={self._storage_path!r}, name={self._run_name!r}) "
                f"puts the run directory {directory!r} inside the run at {outer!r} (it holds "
                f"{INDEX_NAME}): that run's retention and `cairn prune` delete its checkpoint "
                "directories with everything in them. Pass a storage_path outside every run "
                f"directory, such as {os.path.dirname(outer)!r} (where that run lies), with a "
                "name of this run's own."
            )
        return run

    def _check_local_mode(self) -> None:
        """Checks of ``ScalingConfig(num_workers=0)`` made when ``fit()`` starts
        (``TorchTrainer`` refuses a torchrun launch here)."""

    def fit(self) -> Result:
        local = self.scaling_config.local_mode
        if local:
            self._check_local_mode()
        run_config = local_run_config(self.run_config) if local else self.run_config
        run = self._run_location()
        _create_local_run_directory(run, self._storage_path,
                                    durable=self.run_config.storage_fsync)
        retry = self.run_config.storage_retry
        # The start-up has a budget of its own (RunConfig.startup_retry): a driver started
        # during a storage outage may wait for it longer than any later call would.
        startup = self.run_config.startup_retry or retry
        try:
            # Before the lease: a run directory Ray Train wrote gets nothing written.
            refuse_ray_train_run(run, startup, name=self._run_name)
        except StorageError as exc:
            _raise_startup_error(run, exc)
        lease = RunLease(run, startup)
        try:
            lease.acquire()
        except StorageError as exc:
            _raise_startup_error(run, exc)
        try:
            try:
                opened = open_run(run, self.run_config.checkpoint_config, startup,
                                  durable=self.run_config.storage_fsync)
            except StorageError as exc:
                _raise_startup_error(run, exc)
            durable = self.run_config.storage_fsync
            history = SegmentLog(run.join(METRICS_DIR), retry, durable=durable,
                                 fence=lease.fence)
            events = SegmentLog(run.join(EVENTS_DIR), retry, durable=durable, fence=lease.fence)
            spec = TrainSpec(self.train_loop_per_worker, self.train_loop_config or {},
                             self._pass_config, list(self._setup_hooks),
                             list(self._teardown_hooks), self._attempt_env,
                             validation_config=self.validation_config,
                             datasets=self.datasets, dataset_config=self.data_config,
                             data_context=self._data_context)
            # The event stream first: the manager is built once, with every collaborator
            # (every index write first checks that this driver still holds the run).
            observers = build_observers(spec, self.scaling_config, run_config, history,
                                        events)
            pending = PendingValidations()
            manager = build_manager(run, self.run_config, opened, history,
                                    fence=lease.fence, stream=observers.stream,
                                    pending=pending)
            _log_run_start(self._run_name, run, manager)
            earlier = _last_report(run.join(METRICS_DIR), retry)
            next_index = max(manager.index.next_report_index,
                             int(earlier.get("report_index", 0)) + 1)
            # Local mode: the train function runs on this thread, the controller on another.
            returned: list[Any] = []
            driver = DriverRun()
            backend = in_process_backend(spec, returned, driver) if local else None
            controller = build_controller(spec, self.scaling_config, run_config, manager,
                                          observers, pending, history, events,
                                          experiment_name=self._run_name,
                                          next_report_index=next_index,
                                          options=self.run_config.storage_options(),
                                          backend=backend)
            outcome = controller.run() if backend is None else driver.run(controller, backend)
        finally:
            lease.release()
        # A fit() without a report of its own (a finished run run again: its train function
        # resumes at its end) gives the run's last report, as Result.from_path does.
        reported = outcome.last_report_index is not None
        result = build_result(
            run, manager.index, self.run_config.checkpoint_config,
            metrics=(outcome.last_metrics or None) if reported
            else earlier.get("metrics") or None,
            error=outcome.error,
            return_value=returned[-1] if returned else outcome.return_value, retry=retry,
            report_index=outcome.last_report_index if reported else earlier.get("report_index"))
        try:
            call_hooks(self.run_config.callbacks, "on_run_end", result)
        except ControllerError as exc:
            if outcome.error is None:
                # The README's promise and Ray Train's callback manager (every hook, the
                # controller's shutdown hooks too): a callback that raises fails fit(). The
                # run itself is complete on storage, which says so.
                finished = (f"Run {self._run_name!r} finished and is stored as finished at "
                            f"{run.display()} (Result.from_path reads it)")
                logger.error("%s; fit() raises the ControllerError of its on_run_end "
                             "callback", finished)
                if sys.version_info >= (3, 11):
                    exc.add_note(f"{finished}; the error is its on_run_end callback's.")
                raise
            # The run's own error is what fit() raises; the callback's is logged above and
            # chained as its context.
            logger.error("Run %r failed; fit() raises its error, not the one of its "
                         "on_run_end callback", self._run_name)
            _raise_run_error(outcome.error)
        if outcome.error is not None:
            _raise_run_error(outcome.error)
        return result

    @classmethod
    def restore(cls, *args: Any, **kwargs: Any) -> NoReturn:
        """Refused, as Ray Train v2 refuses it (``DeprecationWarning``): call ``fit()``
        again with the same ``RunConfig(name=..., storage_path=...)`` to continue a run."""
        raise ConfigDeprecationError(migration.TRAINER_RESTORE)

    @classmethod
    def can_restore(cls, *args: Any, **kwargs: Any) -> NoReturn:
        """Refused, as Ray Train v2 refuses it (``DeprecationWarning``); see :meth:`restore`."""
        raise ConfigDeprecationError(migration.TRAINER_RESTORE)


def _raise_run_error(error: BaseException) -> NoReturn:
    """Raise the error of a failed run as built, as Ray Train raises it: a
    :class:`WorkerGroupError` with each rank's exception (or a ControllerError); its text
    names where the run stays. In local mode its cause is the train function's own
    exception (local_mode.py)."""
    if isinstance(error, TrainingFailedError):
        raise error
    raise ControllerError(error) from error


def _raise_startup_error(run: StorageLocation, exc: StorageError) -> NoReturn:
    """Raise the error of a start-up the storage did not let through: the run is intact.

    Damage and missing files are raised as they are: they are no outage.
    """
    if isinstance(exc, (CheckpointDamagedError, CheckpointNotFoundError)):
        raise exc
    raise StorageError(
        f"The driver could not start the run at {run.display()}: {exc}. The run is intact "
        "(a start-up changes nothing it cannot redo) and can be started again with the "
        "same RunConfig once the storage answers; RunConfig(startup_retry=RetryPolicy("
        "max_attempts=..., max_backoff_s=...)) makes the driver wait longer at start."
    ) from exc


def _absolute_storage_path(path: str | os.PathLike[str], filesystem: Any) -> str:
    """``path`` with a local relative path made absolute, once: a later ``chdir`` does
    not move the run. URIs and paths inside a ``storage_filesystem`` stay as given; a
    mistyped URI (``s3:/bucket``) is refused here, not taken for a local directory."""
    text = os.fspath(path)
    if filesystem is not None or scheme_of(text) is not None:
        return text
    check_uri_typo(text, argument="RunConfig.storage_path")
    return os.path.abspath(os.path.expanduser(text))


def _create_local_run_directory(run: StorageLocation, storage_path: str, *,
                                durable: bool) -> None:
    """Create the run directory on local storage, or raise :class:`ConfigError` naming
    ``storage_path`` and the system's reason (``/proc/x``, a path under a file, a
    directory this process may not write to). A failure leaves no directory it created.
    With ``durable`` (``storage_fsync``), the entry of each directory it created is
    fsynced in its parent: a new run's directory outlives a crash of the machine.
    """
    relative = local_os_path(run)
    if relative is None:
        return  # remote storage: its errors come with the start-up's retries
    # Absolute before climbing to its parents: a SubTreeFileSystem with a relative base
    # path gives a relative one, whose top parent would be "" (no directory to fsync).
    path = os.path.abspath(relative)
    missing = []
    ancestor = path
    while not os.path.lexists(ancestor):
        missing.append(ancestor)
        parent = os.path.dirname(ancestor)
        if parent == ancestor:
            break
        ancestor = parent
    try:
        os.makedirs(path, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
    except OSError as exc:
        for created in missing:  # innermost first
            try:
                os.rmdir(created)
            except OSError:
                pass
        reason = exc.strerror or str(exc)
        raise ConfigError(
            f"RunConfig.storage_path={storage_path!r} cannot hold runs: the run directory "
            f"{path!r} cannot be created or written to ({reason}). Pass a directory this "
            "process can create and write to, or a storage URI such as 's3://bucket/runs'."
        ) from exc
    if durable:
        for created in missing:  # innermost first: each entry in its parent
            fsync_path(os.path.dirname(created))


def _enclosing_run(path: str) -> str | None:
    """The run directory that ``path`` (an absolute local path) lies inside: the nearest
    parent that holds a run index, found on ``path`` as written and on its real path (a
    symbolic link may lead into a run); None when there is none.

    Local storage only, where a few ``stat`` calls answer it. Not on remote stores: there
    it would cost one request per parent prefix at every start, and a prefix-scoped
    permission may refuse the requests above the storage path.
    """
    for start in dict.fromkeys((path, os.path.realpath(path))):
        found = nearest_marked(os.path.dirname(start), (INDEX_NAME,))
        if found is not None:
            return found[0]
    return None


def _log_run_start(name: str, run: StorageLocation, manager: CheckpointManager) -> None:
    if not manager.index.attempts and not manager.index.checkpoints:
        logger.info("Starting new run %r at %s", name, run.display())
        return
    latest = manager.index.latest
    if latest is None:
        logger.info("Continuing run %r at %s (no committed checkpoint yet; attempt %d)",
                    name, run.display(), manager.index.attempts + 1)
    else:
        logger.info("Continuing run %r at %s from checkpoint %s (report %d)", name,
                    run.display(), latest.dir_name, latest.report_index)


def _last_report(metrics: StorageLocation, retry: RetryPolicy) -> dict[str, Any]:
    """The run's last report in its metrics history (``report_index``, ``metrics``), or
    an empty dict for a run without one."""
    records = [r for r in read_log(metrics, retry)
               if isinstance(r.get("report_index"), int) and isinstance(r.get("metrics"), dict)]
    return max(records, key=lambda r: int(r["report_index"]), default={})
