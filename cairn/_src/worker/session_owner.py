"""Which threads of a process the worker session (:mod:`.session`) answers.

In a worker process the session answers every thread: the train function's, and the
threads that function starts (an asynchronous checkpointer's completion callback that
reports, say). In local mode (``ScalingConfig(num_workers=0)``) the driver runs in the same
process, and two of its threads run user code: the controller's, ``cairn-controller``,
which calls the callbacks of ``RunConfig(callbacks=...)``, and ``cairn-validate-<dir>``,
which calls a validation function. Those threads are the driver's, never the train
function's, so the session refuses them, with the error a driver process gives when its
run has workers (it has no session), saying which thread called: a callback's
``report()`` would otherwise count as one of rank 0's reports, and a collective on the
controller's thread would wait for that very thread for good. Ray Train's callbacks and
validation functions run outside its workers too, where its ``get_context()`` and
``report()`` raise. (A thread that a callback starts is not told apart: in local mode it
reaches the session, as any thread of the process does.)

The driver's threads are told by the names it gives them (ARCHITECTURE.md's table of
threads; ``train/local_mode.py`` and ``controller/validations.py`` start them), since
neither module can be imported from the worker's layer; ``tests/train/
test_local_mode_callbacks.py`` runs both cases.
"""

from __future__ import annotations

import threading

from cairn._src.errors import OutsideWorkerError

# The names of the driver's threads that run user code (see the module docstring).
CONTROLLER_THREAD = "cairn-controller"
VALIDATION_THREAD_PREFIX = "cairn-validate-"


def driver_thread_runs() -> str | None:
    """The user code that the calling thread runs when it is one of the driver's threads
    that run user code; None for any other thread."""
    name = threading.current_thread().name
    if name == CONTROLLER_THREAD:
        return "the callbacks of RunConfig(callbacks=...)"
    if name.startswith(VALIDATION_THREAD_PREFIX):
        return "a validation function (ValidationConfig.fn)"
    return None


def outside_worker(function: str) -> OutsideWorkerError:
    """The error of ``cairn.<function>()`` called where no worker session answers: in a
    process that has none (the driver's, in a run with workers), or on one of the driver's
    threads that run user code (:func:`driver_thread_runs`)."""
    runs = driver_thread_runs()
    where = "" if runs is None else (
        f": on the driver's thread {threading.current_thread().name!r}, which runs {runs}. "
        "Callbacks and validation functions run on the driver, not in a worker, in local "
        "mode (ScalingConfig(num_workers=0)) too, where the train function runs in the "
        "driver's process"
    )
    return OutsideWorkerError(
        f"cairn.{function}() was called outside a Cairn worker{where}. Call it inside the "
        "train_loop_per_worker function that Trainer(...).fit() runs."
    )
