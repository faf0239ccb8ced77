"""Entry point of a worker process: ``python -m cairn._src.worker.main``.

Reads its bootstrap line from stdin, connects to the controller with the per-run secret,
receives its setup, runs the user's function on the main thread, waits for its pending
uploads to commit, and reports the return value or the error.
"""

from __future__ import annotations

import bdb
import contextlib
import gc
import importlib
import json
import logging
import os
import pickle
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from typing import Any, NoReturn

import cloudpickle

from cairn._src.errors import AttemptStopped, CheckpointCollisionError, ConfigError, ReportError
from cairn._src.run.storage_check import check_storage_marker
from cairn._src.storage.registry import import_registrations
from cairn._src.wire.bootstrap import NODE_ADDRESS_ENV
from cairn._src.wire.code_locations import failing_frame, loads_located
from cairn._src.wire.messages import (
    DoneMessage,
    ErrorMessage,
    RejoinMessage,
    SetupMessage,
    TimingMessage,
)
from cairn._src.wire.sockets import abort_connection, disable_nagle, set_io_timeout
from cairn._src.wire.tls import ClientTunnel, client_context, open_client_tunnel
from cairn._src.worker.memory_copy import MemoryCopies
from cairn._src.worker.peer_fetch import local_host_toward
from cairn._src.worker.preemption import NoticeSource, SigtermNotice
from cairn._src.worker.session import WorkerSession, set_session

logger = logging.getLogger(__name__)

# Mistakes in the training code that a restart would only repeat.
FATAL_ERRORS = (ReportError, ConfigError, CheckpointCollisionError)
_CONNECT_TIMEOUT_S = 30.0
_FLUSH_TIMEOUT_S = 10.0
# Modules a worker imports before it reads its bootstrap (see _preload).
PRELOAD_ENV = "CAIRN_PRELOAD"
# What ends a run whose train function runs in the driver's process (local mode) instead
# of failing its attempt: Ctrl-C, sys.exit() (Lightning turns Ctrl-C into sys.exit(1)) and
# "q" at a debugger's prompt. Each ends the run as interrupted, no failure counted, and
# fit() raises it as it was raised, as Ray Train's local mode does.
INTERRUPTS: tuple[type[BaseException], ...] = (KeyboardInterrupt, SystemExit, bdb.BdbQuit)


def _pickle_exception(exc: BaseException) -> bytes | None:
    try:
        data = cloudpickle.dumps(exc)
        pickle.loads(data)
        return bytes(data)
    except Exception:
        return None


@dataclass(frozen=True)
class InDriver:
    """A worker that runs in the driver's own process (local mode, ``num_workers=0``).

    The train function, its config and the hooks are the driver's own objects, not copies
    unpickled from the setup message, so the function sees and changes the driver's state
    as a direct call would. ``on_controller_lost`` replaces the worker's exit when the
    controller's connection drops. One of :data:`INTERRUPTS` in the train function (Ctrl-C,
    ``sys.exit()``, quitting the debugger) is raised to the caller instead of reported as
    the rank's failure: it ends the run, not the attempt.
    """

    train_fn: Callable[..., Any]
    config: Any
    on_controller_lost: Callable[[], None]
    setup_hooks: list[Callable[[Any], None]] = field(default_factory=list)
    teardown_hooks: list[Callable[[Any], None]] = field(default_factory=list)
    # Given rank 0's return value itself (Result.return_value is then that object).
    on_return: Callable[[Any], None] | None = None
    # Called on one of INTERRUPTS in the train function before the connection closes: it
    # ends the run (interrupted), so that the controller does not take the closing for a
    # failure.
    on_interrupt: Callable[[], None] | None = None
    # Given the exception itself, with its traceback, before it is reported as the rank's
    # failure: fit() raises the run's error from it, where the frames that failed are.
    on_failure: Callable[[BaseException], None] | None = None


def run_worker(connection: Connection, rank: int, attempt: int,
               in_driver: InDriver | None = None,
               notices: NoticeSource | None = None,
               memory: MemoryCopies | None = None) -> int | RejoinMessage:
    """Run this rank's share of ``attempt``: the exit code, or, for a rank the controller
    keeps after another rank failed (``FailureConfig(keep_survivors=True)``), the
    :class:`RejoinMessage` of the attempt it is to run next in this same process.
    ``memory``: this process's memory copies of checkpoints, used with keep_survivors."""
    if in_driver is None:
        # What exists now (the imported modules: about 300,000 objects with torch, which
        # CAIRN_PRELOAD imports before the bootstrap) is left out of later collections in
        # a rank that may be kept: the collection that releases a stopped attempt's frames
        # then looks at what the attempt made only (0.12 s with torch loaded, against well
        # under a millisecond). Before anything of the attempt exists (its setup, its
        # session, its train function and config): frozen objects are never collected,
        # and those hold reference cycles, so a kept process would keep each attempt's
        # for good. Nothing is freed early: frozen objects keep what they refer to alive.
        gc.freeze()
    connection.send(("hello", rank, os.getpid(), attempt))
    kind, registrations = connection.recv()
    assert kind == "registrations"
    import_registrations(cloudpickle.loads(registrations))
    setup = connection.recv()
    assert isinstance(setup, SetupMessage)
    if in_driver is None and not setup.keep_survivors:
        gc.unfreeze()  # no rank of this run is kept: nothing to leave out
    session = WorkerSession(connection, setup, cloudpickle.loads(setup.retry),
                            on_controller_lost=(in_driver.on_controller_lost
                                                if in_driver is not None else leave),
                            memory=memory if setup.keep_survivors else None)
    set_session(session)
    teardown = in_driver.teardown_hooks if in_driver is not None else []
    if notices is not None:  # the node is about to be reclaimed: tell the controller
        notices.attach(rank, session.send)
    try:
        if setup.storage_token is not None:
            check_storage_marker(setup.run, setup.storage_token, session.retry)
        try:
            if in_driver is not None:
                hooks, train_fn, config = (in_driver.setup_hooks, in_driver.train_fn,
                                           in_driver.config)
            else:
                hooks = cloudpickle.loads(setup.setup_hooks)
                train_fn = loads_located(setup.train_fn)
                config = cloudpickle.loads(setup.config)
                teardown = cloudpickle.loads(setup.teardown_hooks)
        except Exception as exc:
            # The same in every attempt: a module the worker cannot import, say.
            raise ConfigError(
                f"The worker could not load the train function or its config: "
                f"{type(exc).__name__}: {exc}. Define it in a module the workers can import "
                "(the driver's sys.path is passed on) or in the script you run."
            ) from exc
        for hook in hooks:
            hook(session.context)
        # Start-up and recovery end here, for goodput.
        session.send(TimingMessage(rank, "train_start", 0.0, time.time()))
        value = train_fn(config) if setup.pass_config else train_fn()
        session.finish()
        for hook in teardown:
            hook(session.context)
    except BaseException as exc:
        if in_driver is not None:
            _tear_down_after_failure(teardown, session.context)
        if in_driver is not None and isinstance(exc, INTERRUPTS):
            logger.info("The train function raised %s: the run ends, interrupted, without "
                        "a restart", type(exc).__name__)
            session.close()
            if in_driver.on_interrupt is not None:
                in_driver.on_interrupt()
            raise
        fatal = isinstance(exc, FATAL_ERRORS)
        if (in_driver is None and setup.keep_survivors and not fatal
                and isinstance(exc, Exception | AttemptStopped)):
            return _stop_for_rejoin(session, setup, exc)
        if in_driver is not None and in_driver.on_failure is not None:
            in_driver.on_failure(exc)
        message = _error_message(rank, exc, fatal=fatal)
        session.close()
        session.send(message)
        if in_driver is None and not fatal:
            # ASYNC uploads of reports this rank made before it failed: their checkpoints
            # may still commit (the controller waits for the reports the failed rank
            # reached, a bounded grace, and ends this process when it gives up).
            session.join(receiver=False)
        return 1
    returned: bytes | None = None
    if in_driver is not None and in_driver.on_return is not None:
        in_driver.on_return(value)
    elif rank == 0:
        try:
            returned = cloudpickle.dumps(value)
        except Exception:
            logger.warning("The return value of rank 0 cannot be pickled; Result.return_value "
                           "will be None")
    session.close()
    # The controller reads a worker's connection before acting on its exit (and waits
    # briefly for it), so the Done message is seen even if the exit is noticed first.
    session.send(DoneMessage(rank, session.report_count, returned))
    return 0


def _error_message(rank: int, exc: BaseException, *, fatal: bool) -> ErrorMessage:
    return ErrorMessage(rank=rank, error_type=type(exc).__name__, message=str(exc),
                        traceback="".join(traceback.format_exception(exc)),
                        exception=_pickle_exception(exc), fatal=fatal,
                        frame=failing_frame(exc))


def _stop_for_rejoin(session: WorkerSession, setup: SetupMessage,
                     exc: BaseException) -> int | RejoinMessage:
    """The train function of a rank that may be kept ended (it raised, or the controller
    stopped it): report the error, end what the attempt set up in this process (its
    process group, so that peers blocked in a collective with it fail at once), and wait
    for the controller to say whether this process runs the next attempt."""
    if not isinstance(exc, AttemptStopped):
        session.send(_error_message(setup.rank, exc, fatal=False))
    # The train function's frames (kept alive by the traceback) hold its model, and a DDP
    # model holds the process group open: release them before the group is ended.
    _clear_frames(exc)
    gc.collect()
    for hook in cloudpickle.loads(setup.teardown_hooks):
        try:
            hook(session.context)
        except Exception as hook_error:
            logger.warning("Rank %d: a teardown after the train function stopped failed: %s",
                           setup.rank, hook_error)
    rejoin = session.wait_to_rejoin(setup.attempt)
    session.close()
    if rejoin is None:
        # The controller's connection ended while this rank waited to rejoin: the driver
        # is gone, so this process leaves as any worker whose driver is gone, with the
        # processes its train function started.
        leave()
    return rejoin


def _clear_frames(exc: BaseException) -> None:
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if error.__traceback__ is not None:
            traceback.clear_frames(error.__traceback__)
            error.__traceback__ = None
        error = error.__cause__ or error.__context__


def _tear_down_after_failure(hooks: list[Callable[[Any], None]], context: Any) -> None:
    """In the driver's process (local mode) the teardown hooks run after a failure too:
    the process goes on, and what they end (a process group) would outlive the attempt."""
    for hook in hooks:
        try:
            hook(context)
        except Exception:
            logger.warning("A teardown hook failed after the train function failed",
                           exc_info=True)


def connect(boot: dict[str, Any]) -> Connection:
    """An authenticated connection to the controller that ``boot`` names: plain TCP, or
    a TLS tunnel that trusts only the run's certificate when ``boot`` carries one."""
    return _connect(boot)[0]


def _connect(boot: dict[str, Any]) -> tuple[Connection, ClientTunnel | None]:
    """:func:`connect`, and the TLS tunnel under the connection when there is one.

    Bounded: the TCP connection, the TLS handshake and each wait of the challenge
    exchange take at most ``_CONNECT_TIMEOUT_S``, so that an address that never answers
    (a black hole, a listener that is not a live controller) raises ``TimeoutError``
    naming it, instead of blocking the worker for good. The connection handed back
    blocks without a limit: the session waits for the controller as long as it lives."""
    address = (boot["address"][0], int(boot["address"][1]))
    authkey = bytes.fromhex(boot["authkey"])
    certificate = boot.get("tls_certificate")
    tunnel: ClientTunnel | None = None
    with _answered_in_time(address, "connection"):
        sock = socket.create_connection(address, _CONNECT_TIMEOUT_S)
    if certificate is None:
        # Connection reads and writes the descriptor itself, which a socket timeout
        # would leave non-blocking.
        sock.settimeout(None)
        connection = Connection(sock.detach())
        disable_nagle(connection)
    else:
        with _answered_in_time(address, "TLS handshake"):
            tunnel = open_client_tunnel(sock, client_context(certificate), _CONNECT_TIMEOUT_S)
        connection = Connection(tunnel.socket.detach())
    try:
        with _answered_in_time(address, "authentication handshake"):
            set_io_timeout(connection, _CONNECT_TIMEOUT_S)
            answer_challenge(connection, authkey)
            deliver_challenge(connection, authkey)
        set_io_timeout(connection, 0)
    except BaseException:
        connection.close()  # a tunnel's pump ends with its plain end
        raise
    return connection, tunnel


@contextlib.contextmanager
def _answered_in_time(address: tuple[str, int], stage: str) -> Iterator[None]:
    """Raise a wait of ``stage`` that ran out (a socket timeout, or ``BlockingIOError``
    from a read or write past ``set_io_timeout``) as a ``TimeoutError`` naming the
    controller's address."""
    try:
        yield
    except (TimeoutError, BlockingIOError) as exc:
        host, port = address
        raise TimeoutError(
            f"The worker could not reach the controller at {host}:{port}: its {stage} got "
            f"no answer within {_CONNECT_TIMEOUT_S:g} s. Check that the driver is still "
            "running and that this address reaches it from the worker's node (a firewall "
            "that drops packets, or another service on that port, never answers)."
        ) from exc


def run_from_bootstrap(boot: dict[str, Any], in_driver: InDriver | None = None,
                       notices: NoticeSource | None = None) -> int:
    """Connect to the controller named by ``boot`` and run this worker's share; a rank
    kept after another rank failed connects again and runs each next attempt it is
    given, in this same process. ``notices`` tells the controller when this worker's node
    is about to be reclaimed."""
    # A kept rank's snapshots, across its attempts (keep_survivors; not in local mode).
    memory = None
    if in_driver is None:
        host = local_host_toward((boot["address"][0], int(boot["address"][1])))
        os.environ[NODE_ADDRESS_ENV] = host
        memory = MemoryCopies(bytes.fromhex(boot["authkey"]),
                              None if boot.get("tls_certificate") else host)
    try:
        while True:
            connection, tunnel = _connect(boot)
            try:
                outcome = run_worker(connection, int(boot["rank"]), int(boot["attempt"]),
                                     in_driver, notices, memory)
            finally:
                if tunnel is not None:
                    # The last messages (Done, an error) may still be in the tunnel: ending
                    # our side lets its pump deliver them, then close; the process may exit
                    # after.
                    abort_connection(connection)
                    connection.close()
                    tunnel.wait_closed(_FLUSH_TIMEOUT_S)
                else:
                    if in_driver is not None:
                        # No process exit closes it: the controller reads the end of the
                        # connection as a worker process's last bytes, and the session's
                        # receiver wakes.
                        abort_connection(connection)
                    connection.close()
            if not isinstance(outcome, RejoinMessage):
                return outcome
            _release_attempt(notices)
            # The next attempt's own variables (a fresh torch rendezvous port).
            os.environ.update(outcome.env)
            boot = {**boot, "attempt": outcome.attempt}
    finally:
        if notices is not None:
            notices.close()


def _release_attempt(notices: NoticeSource | None) -> None:
    """A kept rank between two attempts: nothing refers to the stopped attempt's session
    any more, and what it made is collected before the next attempt's ``gc.freeze()``
    would keep it for good (what existed before the attempt is frozen already, so this
    collection looks at what the attempt made only)."""
    set_session(None)
    if notices is not None:
        notices.detach()
    gc.collect()


def _preload() -> None:
    """Import ``CAIRN_PRELOAD`` (comma-separated modules, e.g. ``torch``) before waiting for
    the bootstrap: a warm standby process has them loaded when its attempt comes."""
    for name in filter(None, (n.strip() for n in os.environ.get(PRELOAD_ENV, "").split(","))):
        try:
            importlib.import_module(name)
        except Exception as exc:  # the train function's own import will say what is wrong
            logger.debug("Could not preload %s: %s", name, exc)


def leave() -> NoReturn:
    """The driver is gone (its connection ended): nobody will commit or answer, so the
    process leaves now, and so do the processes the train function started (a
    ``subprocess``, a ``multiprocessing`` pool) where this worker leads their process
    group, as a local worker does: the driver's shutdown would have ended them."""
    if hasattr(os, "killpg") and os.getpgid(0) == os.getpid():
        os.killpg(0, signal.SIGKILL)  # this process with them
    os._exit(70)


def main() -> None:
    # SIGTERM is the local backend's preemption notice (worker/preemption.py). The local
    # backend starts this process with SIGTERM blocked: one sent while it imported waits
    # for the handler, and is a notice too.
    notices = SigtermNotice()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    _preload()
    line = sys.stdin.buffer.readline()
    if not line:
        # A standby process whose driver ended (or died) before handing it an attempt.
        os._exit(0)
    boot = json.loads(line)
    # The attempt's own variables (the torch rendezvous port), for a process started early.
    os.environ.update({str(k): str(v) for k, v in boot.get("env", {}).items()})
    try:
        code = run_from_bootstrap(boot, notices=notices)
    except BaseException:
        logger.exception("The worker failed outside its train function")
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: non-daemon threads of user libraries must not hang exit.
    os._exit(code)


if __name__ == "__main__":
    main()
