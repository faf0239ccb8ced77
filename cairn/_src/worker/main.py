"""Entry point of a worker process: ``python -m cairn._src.worker.main``.

Reads its bootstrap line from stdin, connects to the controller with the per-run secret,
receives its setup, runs the user's function on the main thread, waits for its pending
uploads to commit, and reports the return value or the error.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import pickle
import socket
import sys
import time
import traceback
from multiprocessing.connection import Client, Connection, answer_challenge, deliver_challenge
from typing import Any

import cloudpickle

from cairn._src.errors import CheckpointCollisionError, ConfigError, ReportError
from cairn._src.run.storage_check import check_storage_marker
from cairn._src.storage.registry import import_registrations
from cairn._src.wire.code_locations import failing_frame, loads_located
from cairn._src.wire.messages import DoneMessage, ErrorMessage, SetupMessage, TimingMessage
from cairn._src.wire.sockets import abort_connection, disable_nagle
from cairn._src.wire.tls import ClientTunnel, client_context, open_client_tunnel
from cairn._src.worker.preemption import NoticeSource, SigtermNotice
from cairn._src.worker.session import WorkerSession, set_session

logger = logging.getLogger(__name__)

# Mistakes in the training code that a restart would only repeat.
FATAL_ERRORS = (ReportError, ConfigError, CheckpointCollisionError)
_CONNECT_TIMEOUT_S = 30.0
_FLUSH_TIMEOUT_S = 10.0
# Modules a worker imports before it reads its bootstrap (see _preload).
PRELOAD_ENV = "CAIRN_PRELOAD"


def _pickle_exception(exc: BaseException) -> bytes | None:
    try:
        data = cloudpickle.dumps(exc)
        pickle.loads(data)
        return bytes(data)
    except Exception:
        return None


def run_worker(connection: Connection, rank: int, attempt: int,
               notices: NoticeSource | None = None) -> int:
    connection.send(("hello", rank, os.getpid(), attempt))
    kind, registrations = connection.recv()
    assert kind == "registrations"
    import_registrations(cloudpickle.loads(registrations))
    setup = connection.recv()
    assert isinstance(setup, SetupMessage)
    session = WorkerSession(connection, setup, cloudpickle.loads(setup.retry))
    set_session(session)
    if notices is not None:  # the node is about to be reclaimed: tell the controller
        notices.attach(rank, session.send)
    try:
        if setup.storage_token is not None:
            check_storage_marker(setup.run, setup.storage_token, session.retry)
        try:
            hooks = cloudpickle.loads(setup.setup_hooks)
            train_fn = loads_located(setup.train_fn)
            config = cloudpickle.loads(setup.config)
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
        for hook in cloudpickle.loads(setup.teardown_hooks):
            hook(session.context)
    except BaseException as exc:
        fatal = isinstance(exc, FATAL_ERRORS)
        message = ErrorMessage(
            rank=rank,
            error_type=type(exc).__name__,
            message=str(exc),
            traceback="".join(traceback.format_exception(exc)),
            exception=_pickle_exception(exc),
            fatal=fatal,
            frame=failing_frame(exc),
        )
        session.close()
        session.send(message)
        return 1
    returned: bytes | None = None
    if rank == 0:
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


def connect(boot: dict[str, Any]) -> Connection:
    """An authenticated connection to the controller that ``boot`` names: plain TCP, or
    a TLS tunnel that trusts only the run's certificate when ``boot`` carries one."""
    return _connect(boot)[0]


def _connect(boot: dict[str, Any]) -> tuple[Connection, ClientTunnel | None]:
    """:func:`connect`, and the TLS tunnel under the connection when there is one."""
    address = (boot["address"][0], int(boot["address"][1]))
    authkey = bytes.fromhex(boot["authkey"])
    certificate = boot.get("tls_certificate")
    if certificate is None:
        connection = Client(address, authkey=authkey)
        disable_nagle(connection)
        return connection, None
    sock = socket.create_connection(address, _CONNECT_TIMEOUT_S)
    tunnel = open_client_tunnel(sock, client_context(certificate), _CONNECT_TIMEOUT_S)
    connection = Connection(tunnel.socket.detach())
    answer_challenge(connection, authkey)
    deliver_challenge(connection, authkey)
    return connection, tunnel


def run_from_bootstrap(boot: dict[str, Any], notices: NoticeSource | None = None) -> int:
    """Connect to the controller named by ``boot`` and run this worker's share;
    ``notices`` tells the controller when this worker's node is about to be reclaimed."""
    connection, tunnel = _connect(boot)
    try:
        return run_worker(connection, int(boot["rank"]), int(boot["attempt"]), notices)
    finally:
        if notices is not None:
            notices.close()
        if tunnel is not None:
            # The last messages (Done, an error) may still be in the tunnel: ending our
            # side lets its pump deliver them, then close; the process may exit after.
            abort_connection(connection)
            connection.close()
            tunnel.wait_closed(_FLUSH_TIMEOUT_S)


def _preload() -> None:
    """Import ``CAIRN_PRELOAD`` (comma-separated modules, e.g. ``torch``) before waiting for
    the bootstrap: a warm standby process has them loaded when its attempt comes."""
    for name in filter(None, (n.strip() for n in os.environ.get(PRELOAD_ENV, "").split(","))):
        try:
            importlib.import_module(name)
        except Exception as exc:  # the train function's own import will say what is wrong
            logger.debug("Could not preload %s: %s", name, exc)


def main() -> None:
    # SIGTERM is the local backend's preemption notice (worker/preemption.py).
    notices = SigtermNotice()
    _preload()
    line = sys.stdin.buffer.readline()
    if not line:
        # A standby process whose driver ended (or died) before handing it an attempt.
        os._exit(0)
    boot = json.loads(line)
    # The attempt's own variables (the torch rendezvous port), for a process started early.
    os.environ.update({str(k): str(v) for k, v in boot.get("env", {}).items()})
    code = run_from_bootstrap(boot, notices)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: non-daemon threads of user libraries must not hang exit.
    os._exit(code)


if __name__ == "__main__":
    main()
