"""Local mode, ``ScalingConfig(num_workers=0)``: the train function runs in the driver.

As in Ray Train 2.60, the function runs in the process that called ``fit()``, on the
calling thread (a ``breakpoint()`` in it stops there). Unlike Ray's local mode, which
keeps the last report in memory and writes nothing, it is an ordinary run of one worker:
the controller commits its checkpoints to storage with manifests, keeps the metrics
history and the event log, restarts on failure within ``FailureConfig.max_failures``,
and a later run with workers resumes from it. For that the controller, unchanged, runs
on a thread of its own (``cairn-controller``) while the calling thread serves the
in-process backend (``backends/in_process.py``).

Differences the user meets (docs/local-mode.md): the live view is off unless
``RunConfig(progress=...)`` or ``CAIRN_PROGRESS`` asks for it (a refreshing status line
would mix with a debugger's prompt); ``RunConfig.worker_env`` is not applied (the function
runs in the driver's environment); Ctrl-C stops the run and ``fit()`` raises
``KeyboardInterrupt``, as it does with workers, and so do ``sys.exit()`` and quitting the
debugger (``SystemExit``, ``bdb.BdbQuit``), as in Ray's local mode; a run that fails for
good raises its ``WorkerGroupError`` from the exception the train function raised, the
object itself (``worker_failures[0]``), whose traceback reaches the frame that failed.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
from typing import TYPE_CHECKING, Any

from cairn._src.config.run import RunConfig
from cairn._src.errors import ConfigError, WorkerGroupError, WorkerProcessError
from cairn._src.observe.live_view import PROGRESS_ENV

if TYPE_CHECKING:
    from cairn._src.backends.in_process import InProcessBackend
    from cairn._src.controller.controller import Controller, RunOutcome
    from cairn._src.controller.payload import TrainSpec

logger = logging.getLogger(__name__)

# What torchrun (torch.distributed.run) sets in each process it starts.
TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                      "MASTER_PORT")


def local_run_config(run_config: RunConfig) -> RunConfig:
    """``run_config`` with the live view off unless the user asked for it."""
    if run_config.progress is None and not os.environ.get(PROGRESS_ENV, "").strip():
        return dataclasses.replace(run_config, progress=0)
    return run_config


def check_not_under_torchrun(environ: dict[str, str] | None = None) -> None:
    """Refuse local mode under a launcher that started several processes (``torchrun``):
    each would be a driver of its own, and only one driver may hold a run."""
    env = os.environ if environ is None else environ
    if not all(name in env for name in TORCHRUN_VARIABLES):
        return
    world = env["WORLD_SIZE"]
    if world.strip() == "1":
        return
    raise ConfigError(
        f"ScalingConfig(num_workers=0) under torchrun (WORLD_SIZE={world}, RANK="
        f"{env['RANK']}): Cairn's local mode runs one process, the driver, which owns the "
        "run; it does not join the processes torchrun started into one world as Ray Train "
        "does. Launch the script once with plain python (not torchrun) and ScalingConfig("
        f"num_workers={world}) (Cairn starts the {world} workers and their process group), "
        "or run each process without TorchTrainer."
    )


def in_process_backend(spec: TrainSpec, returned: list[Any],
                       driver: DriverRun) -> InProcessBackend:
    """The backend that runs ``spec``'s function on the thread calling ``fit()``; its
    return value is appended to ``returned`` (the object itself, not a copy)."""
    # Imported here: `python -m cairn._src.worker.main` imports cairn first, which must
    # not import that module before it runs.
    from cairn._src.backends.in_process import InProcessBackend

    return InProcessBackend(spec.train_fn, spec.config, list(spec.setup_hooks),
                            list(spec.teardown_hooks), on_return=returned.append,
                            on_interrupt=driver.interrupt)


class DriverRun:
    """A local-mode run: the controller on a ``cairn-controller`` thread, each attempt's
    train function on the calling thread (:meth:`run`). Built before the backend, which
    calls :meth:`interrupt` on Ctrl-C in the train function."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._outcome: list[RunOutcome] = []
        self._failure: list[BaseException] = []

    def run(self, controller: Controller, backend: InProcessBackend) -> RunOutcome:
        """The run's outcome, or the controller's own exception.

        On ``KeyboardInterrupt`` here (in the train function or between attempts), or a
        ``SystemExit`` or ``bdb.BdbQuit`` from the function, the controller is interrupted
        as Ctrl-C interrupts it when it runs on the calling thread (the session ends
        "interrupted"), then that exception is raised. A run that failed has the train
        function's own exception in its error (see :func:`with_own_exception`).
        """
        from cairn._src.worker.main import INTERRUPTS

        def run_controller() -> None:
            try:
                self._outcome.append(controller.run())
            except BaseException as exc:
                self._failure.append(exc)
            finally:
                backend.end_serving()

        self._thread = threading.Thread(target=run_controller, name="cairn-controller",
                                        daemon=True)
        self._thread.start()
        raised: BaseException | None = None
        try:
            backend.serve()
        except INTERRUPTS:
            self.interrupt()
            raise
        finally:
            self._thread.join()
            raised = backend.failure_of_last_attempt()
            backend.close()
            release_worker_memory()
        if self._failure:
            raise self._failure[0]
        outcome = self._outcome[0]
        with_own_exception(outcome.error, raised)
        return outcome

    def interrupt(self) -> None:
        """Stop the controller as Ctrl-C would and wait for it (the calling thread)."""
        from cairn._src.backends.in_process import raise_in_thread

        thread = self._thread
        if thread is None:
            return
        if thread.ident is not None and thread.is_alive():
            logger.info("Interrupted: stopping the run's controller")
            raise_in_thread(thread.ident, KeyboardInterrupt)
        thread.join()


def release_worker_memory() -> None:
    """Free in the driver what a worker process frees as it exits, once a local-mode run
    has ended (every attempt's session too, its uploads done): the buffer pool of
    ``report_snapshot``, whichever trainer ran the function. Looked up, not imported: a
    run that never loaded ``cairn.torch`` has none, and torch stays unimported."""
    snapshot = sys.modules.get("cairn._src.torch.snapshot")
    if snapshot is not None:
        snapshot.snapshot_buffers().clear()


def with_own_exception(error: BaseException | None, raised: BaseException | None) -> None:
    """Put ``raised``, what the train function raised in the run's last attempt (the object
    itself, with its traceback), in place of its copy in ``error.worker_failures[0]`` (the
    copy unpickled from the rank's report has no traceback), and make it ``error``'s
    cause: ``fit()`` raises ``error`` from it, and the traceback Python prints, or a
    post-mortem debugger walks from the cause, reaches the frame that failed.

    Nothing changes unless ``worker_failures[0]`` is that report's copy: of the same type,
    or a ``WorkerProcessError`` naming it (the exception could not be pickled).
    """
    if not isinstance(error, WorkerGroupError) or raised is None:
        return
    copy = error.worker_failures.get(0)
    if copy is None or not (
            type(copy) is type(raised)
            or (isinstance(copy, WorkerProcessError)
                and str(copy).startswith(f"{type(raised).__name__}: "))):
        return
    error.worker_failures[0] = raised
    error.__cause__ = raised
    error.__suppress_context__ = True
