"""The in-process backend: local mode, ``ScalingConfig(num_workers=0)``.

The train function runs in the driver's own process, on the thread that called ``fit()``
(so that a ``breakpoint()`` in it, signal handlers and libraries that want the main thread
work as in a plain script), as rank 0 of a world of one. It runs the worker runtime every
backend runs (``worker.main``): it connects to the controller over loopback with the
run's secret, and its reports, checkpoints, collectives and validations take the same
path as a worker process's.

The controller then runs on a thread of its own (``cairn-controller``, started by
``train/local_mode.py``). Each attempt is a request from that thread to the calling
thread: :meth:`InProcessBackend.start` queues it, :meth:`InProcessBackend.serve` (the
calling thread) runs it and marks the worker's exit on a pipe the controller waits on,
as it waits on a process's pidfd. The backend owns nothing else; each object keeps one
owner: the controller thread its controller, the calling thread the worker session. The
session answers the function and the threads it starts, never the controller's thread,
which runs the callbacks (:mod:`cairn._src.worker.session_owner`).

What a process backend does by killing the process, this one does by raising
:class:`TrainFunctionStopped` in the calling thread: from the handler of a real-time signal
sent to that thread (:data:`STOP_SIGNAL`), which also interrupts a wait on a lock (a SYNC
report waiting for a commit that will not come), or, where the thread is not the main one
or the platform has no such signal, as an asynchronous exception at its next Python line.
"""

from __future__ import annotations

import ctypes
import logging
import os
import queue
import signal
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cairn._src.errors import ReportError
from cairn._src.worker.main import INTERRUPTS, InDriver, run_from_bootstrap
from cairn._src.worker.session import get_session, set_session

if TYPE_CHECKING:
    from collections.abc import Callable

    from cairn._src.backends.protocol import WorkerHandle
    from cairn._src.wire.bootstrap import Bootstrap

logger = logging.getLogger(__name__)

# A real-time signal, which no library claims (SIGUSR1 is SLURM's requeue notice in
# Lightning, say); None where the platform has none.
STOP_SIGNAL: int | None = signal.SIGRTMIN + 3 if hasattr(signal, "SIGRTMIN") else None


class TrainFunctionStopped(BaseException):
    """Raised in the train function of a local-mode run when the controller ended its
    attempt (a failure elsewhere, a lost lease): the stand-in for a killed process. A
    ``BaseException``, so that ``except Exception`` in user code does not swallow it."""


def raise_in_thread(ident: int, error: type[BaseException]) -> bool:
    """Raise ``error`` in the thread ``ident`` at its next Python line; whether it was set.

    A thread blocked in C (a lock, a socket) sees it once the call returns.
    """
    changed = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident),
                                                        ctypes.py_object(error))
    return bool(changed == 1)


class InProcessWorker:
    """The handle of one attempt's rank 0, run by :meth:`InProcessBackend.serve`."""

    rank = 0
    node_id = "local"
    preempted = False
    # Its connection is shut down before its end is signalled.
    last_message_may_trail = False

    def __init__(self, bootstrap: Bootstrap) -> None:
        self.bootstrap = bootstrap
        self.pid = os.getpid()
        # The read end is the controller thread's (it waits on it), the write end the
        # calling thread's (it marks the end): each closes its own.
        self._read_fd: int | None
        self._write_fd: int | None
        self._read_fd, self._write_fd = os.pipe()
        self._lock = threading.Lock()
        self._ended = threading.Event()
        self._running_in: int | None = None
        self._signal: int | None = None
        self.stop_requested = False
        self.exit_code: int | None = None
        self.error: BaseException | None = None
        # What the train function raised, reported as the attempt's failure: the object
        # itself, with its frames, kept while this is the run's last attempt.
        self.failure: BaseException | None = None
        self._superseded = False

    @property
    def exit_watcher(self) -> InProcessWorker:
        return self

    def fileno(self) -> int:
        assert self._read_fd is not None
        return self._read_fd

    def begin(self, stop_signal: int | None = None) -> bool:
        """The calling thread takes the attempt; False when it was stopped before.

        With ``stop_signal``, a stop is that signal sent to this thread, whose handler
        (installed by the caller) calls :meth:`raise_if_stopped`.
        """
        with self._lock:
            if self.stop_requested:
                return False
            self._running_in = threading.get_ident()
            self._signal = stop_signal
            return True

    def raise_if_stopped(self) -> None:
        """In the stop signal's handler: raise :class:`TrainFunctionStopped` while the
        calling thread still runs the stopped attempt. No lock: the handler runs on that
        thread, which may hold it."""
        if self.stop_requested and self._running_in == threading.get_ident():
            raise TrainFunctionStopped

    def end(self, code: int, error: BaseException | None = None) -> None:
        """The train function returned (or raised): the controller sees an exit."""
        with self._lock:
            self._detach()
            if self._ended.is_set():
                return
            self.exit_code, self.error = code, error
            self._ended.set()
            if self._write_fd is not None:
                try:
                    os.write(self._write_fd, b"x")
                except OSError:
                    # The controller already closed its end (it went on to the next
                    # attempt): nobody waits for this mark.
                    pass
                finally:
                    os.close(self._write_fd)
                    self._write_fd = None

    def keep_failure(self, error: BaseException) -> None:
        """The calling thread: the train function raised ``error``, its failure. Not kept
        once a later attempt started (see :meth:`supersede`)."""
        with self._lock:
            if not self._superseded:
                self.failure = error

    def supersede(self) -> None:
        """A later attempt started: the failure kept is dropped, so that its frames (the
        train function's model, say) do not live on through the restarts."""
        with self._lock:
            self._superseded = True
            self.failure = None

    @property
    def ended(self) -> bool:
        """Whether the calling thread is done with this attempt."""
        return self._ended.is_set()

    def detach(self) -> None:
        """The calling thread leaves the attempt without ending it (Ctrl-C: the caller
        stops the controller first); a stop no longer reaches that thread."""
        with self._lock:
            self._detach()

    def _detach(self) -> None:
        # Under the lock, so no stop() raises after this; one raised but not yet seen by
        # the thread is withdrawn (a NULL exception clears it).
        # (A stop signal not yet handled finds the attempt over: raise_if_stopped.)
        if self._running_in is not None and self.stop_requested and self._signal is None:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._running_in), None)
        self._running_in = None

    def stop(self) -> None:
        """Stop the train function (the controller's kill): raise
        :class:`TrainFunctionStopped` in it, once."""
        with self._lock:
            if self.stop_requested:
                return
            self.stop_requested = True
            if self._running_in is None:
                return
            if self._signal is not None:
                signal.pthread_kill(self._running_in, self._signal)
            else:
                raise_in_thread(self._running_in, TrainFunctionStopped)

    def describe_exit(self) -> str:
        if not self._ended.is_set():
            return "is still running (in the driver's process)"
        if self.error is not None:
            return (f"(local mode, in the driver's process) ended with "
                    f"{type(self.error).__name__}: {self.error}")
        return (f"(local mode, in the driver's process) ended with code {self.exit_code} "
                "before it said it finished")

    def wait_exit(self, timeout: float) -> bool:
        return self._ended.wait(timeout)

    def close_watcher(self) -> None:
        """The controller is done with this attempt: its end of the pipe is closed."""
        if self._read_fd is not None:
            os.close(self._read_fd)
            self._read_fd = None

    def close(self) -> None:
        """After the run (every thread is done with it): both ends."""
        self.close_watcher()
        with self._lock:
            if self._write_fd is not None:
                os.close(self._write_fd)
                self._write_fd = None


_END = object()


def _end_session() -> None:
    """Forget this thread's worker session once its connection is closed, and wait for its
    threads (the receiver sees the end of the connection; the uploader its last job)."""
    try:
        session = get_session("local mode")
    except ReportError:
        return
    set_session(None)
    session.close()
    session.join()


@dataclass
class InProcessBackend:
    """Runs rank 0 of every attempt on the thread that calls :meth:`serve`.

    ``train_fn``, ``config`` and the hooks are the driver's own objects (see
    :class:`~cairn._src.worker.main.InDriver`); ``on_return`` receives the function's
    return value; ``on_interrupt`` ends the run on Ctrl-C, ``sys.exit()`` or quitting the
    debugger in the function (:data:`~cairn._src.worker.main.INTERRUPTS`).
    """

    train_fn: Callable[..., Any]
    config: Any
    setup_hooks: list[Callable[[Any], None]] = field(default_factory=list)
    teardown_hooks: list[Callable[[Any], None]] = field(default_factory=list)
    on_return: Callable[[Any], None] | None = None
    on_interrupt: Callable[[], None] | None = None
    name: str = "in_process"
    bind_host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        self._requests: queue.Queue[object] = queue.Queue()
        self.workers: list[InProcessWorker] = []
        # Earlier attempts the calling thread had not yet ended when the next one started.
        self._ending: list[InProcessWorker] = []

    def advertise_host(self) -> str:
        return self.bind_host

    # --- the controller's thread ---------------------------------------------------------

    def start(self, num_workers: int, bootstrap: Bootstrap, *,
              env: dict[str, str] | None = None) -> list[WorkerHandle]:
        """Hand the attempt to the calling thread: one worker, whatever ``num_workers``
        (0 in local mode). ``env`` is not applied: the driver's environment is the one the
        function runs in."""
        # The watcher of an attempt still ending (its function finishing an upload, say)
        # stays open until it ends, so that end() finds a reader; close() closes the rest.
        earlier = [*self._ending, *self.workers]
        for old in earlier:
            old.supersede()
            if old.ended:
                old.close_watcher()
        self._ending = [old for old in earlier if not old.ended]
        worker = InProcessWorker(bootstrap)
        self.workers = [worker]
        self._requests.put(worker)
        logger.info("Attempt %d: the train function runs in the driver's process (local "
                    "mode, pid %d)", bootstrap.attempt, worker.pid)
        return [worker]

    def failure_of_last_attempt(self) -> BaseException | None:
        """What the train function raised in the last attempt started, reported as its
        failure: the object itself, with its traceback; None when it raised nothing (or
        was stopped). Read before :meth:`close`."""
        return self.workers[0].failure if self.workers else None

    def shutdown(self, *, grace_s: float = 5.0) -> None:
        """Wait up to ``grace_s`` for the train function to return, then stop it."""
        for worker in self.workers:
            if not worker.wait_exit(grace_s):
                worker.stop()

    def kill(self) -> None:
        for worker in self.workers:
            worker.stop()

    def prepare_standby(self) -> None:
        """No spares: the next attempt runs in this process too."""

    def stop_standby(self) -> None:
        """No spares to stop."""

    def close(self) -> None:
        """After the run: the last attempt's pipe is closed (the calling thread)."""
        for worker in [*self._ending, *self.workers]:
            worker.close()
        self.workers, self._ending = [], []

    def end_serving(self) -> None:
        """The run is over: :meth:`serve` returns (from any thread)."""
        self._requests.put(_END)

    # --- the calling thread --------------------------------------------------------------

    def serve(self) -> None:
        """Run each attempt the controller starts until :meth:`end_serving`.

        A ``KeyboardInterrupt`` (Ctrl-C in the train function or while waiting), or a
        ``SystemExit`` or ``bdb.BdbQuit`` from the function (:data:`~cairn._src.worker.
        main.INTERRUPTS`), is raised to the caller, with the attempt it interrupted left
        running for the controller: the caller stops the controller before anything else.
        """
        while True:
            request = self._requests.get()
            if request is _END:
                return
            assert isinstance(request, InProcessWorker)
            self._run(request)

    def _run(self, worker: InProcessWorker) -> None:
        previous: Any = None
        stop_signal = (STOP_SIGNAL if threading.current_thread() is threading.main_thread()
                       else None)
        if stop_signal is not None:
            previous = signal.signal(stop_signal,
                                     lambda signum, frame: worker.raise_if_stopped())
        try:
            self._run_attempt(worker, stop_signal)
        finally:
            if stop_signal is not None:
                signal.signal(stop_signal, signal.SIG_DFL if previous is None else previous)

    def _run_attempt(self, worker: InProcessWorker, stop_signal: int | None) -> None:
        if not worker.begin(stop_signal):
            worker.end(1)
            return

        def interrupt() -> None:
            worker.detach()  # the controller's kill as it ends must not reach this thread
            if self.on_interrupt is not None:
                self.on_interrupt()

        def keep_failure(error: BaseException) -> None:
            # The controller's stop is its own failure, not the function's.
            if not isinstance(error, TrainFunctionStopped):
                worker.keep_failure(error)

        in_driver = InDriver(train_fn=self.train_fn, config=self.config,
                             on_controller_lost=worker.stop,
                             setup_hooks=self.setup_hooks, teardown_hooks=self.teardown_hooks,
                             on_return=self.on_return, on_interrupt=interrupt,
                             on_failure=keep_failure)
        code: int = 1
        error: BaseException | None = None
        try:
            try:
                code = run_from_bootstrap(worker.bootstrap.body(0), in_driver)
            finally:
                _end_session()
        except TrainFunctionStopped as exc:
            logger.info("The train function was stopped: the controller ended attempt %d",
                        worker.bootstrap.attempt)
            error = exc
        except INTERRUPTS:  # before Exception: bdb.BdbQuit is one
            worker.detach()
            raise
        except Exception as exc:
            # The connection broke (the controller is closing): its exit ends the attempt.
            logger.debug("The in-process worker ended on %r", exc)
            error = exc
        while True:
            try:
                worker.end(code, error)
                return
            except TrainFunctionStopped:
                continue  # a stop that came as the function ended: end() withdraws it
