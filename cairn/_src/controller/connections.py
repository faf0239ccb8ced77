"""The controller's connections to its workers.

An acceptor thread takes connections on the controller's listener and authenticates each
on a handshake thread of its own, with a deadline; authenticated connections, like the
commit thread's results, reach the controller loop through its :class:`Inbox`, which the
loop waits on without polling.

Sends and reads run on the controller loop's thread only; a worker whose connection
breaks becomes that rank's failure in its attempt.

The listener binds one address (loopback, or the driver node's address on a cluster);
with TLS on, each accepted connection is a TLS tunnel (:mod:`cairn._src.wire.tls`);
without it, sends to another machine carry no storage credentials
(:mod:`cairn._src.wire.channel_security`). Refused peers are logged once per address.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import struct
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge

from cairn._src.backends.protocol import WorkerHandle
from cairn._src.controller.attempt import Attempt
from cairn._src.controller.clock import Clock
from cairn._src.controller.inbox import Inbox, NewConnection
from cairn._src.controller.worker_failures import describe_lost
from cairn._src.wire.channel_security import CredentialFreeConnection, RefusalLog, is_same_host
from cairn._src.wire.sockets import abort_connection, disable_nagle
from cairn._src.wire.tls import RunCertificate, make_run_certificate, open_server_tunnel

logger = logging.getLogger(__name__)

_HANDSHAKE_TIMEOUT_S = 10.0
# Handshakes under way at once: more connections wait in the listener's backlog for a slot,
# so that a flood of connections (a port scan on a cluster node) takes a bounded number of
# threads and buffers, each for at most the handshake's deadline.
_HANDSHAKES = 64
_MESSAGES_PER_WAKE = 1000
# How long a rank's last messages may trail the news of its exit. A Ray actor task that
# returned closed its connection after sending Done or its error, and its return travels
# on Ray's own channel (under load it came more than 2 s first): that end is awaited longer.
LAST_MESSAGE_GRACE_S = 2.0
RETURNED_GRACE_S = 30.0
# A dying process closes its sockets a moment before it can be reaped: the end of a rank's
# connection waits this long for its exit, to say how the process ended. Ranks whose
# connections end together wait together, on the loop's clock, and the loop goes on
# meanwhile (Attempt.exits_awaited).
LOST_EXIT_GRACE_S = 0.5
# The loop reads a message once poll() says its first bytes are in; the rest of a large one
# comes in more writes. A rank that dies between them while a process it forked (a
# DataLoader worker, a Pool) keeps the socket open would block that read until every holder
# is gone, and the whole loop with it: a read that waits this long for the next bytes ends
# the connection instead (the rank's lost connection). Reads only: a send stays blocking.
RECEIVE_TIMEOUT_S = 30.0
# A peer on another machine that vanished (power, network) without closing the connection
# is found by TCP keepalive: the first probe after this long idle, then one every
# _KEEPALIVE_INTERVAL_S, the connection ending after _KEEPALIVE_PROBES unanswered.
_KEEPALIVE_IDLE_S = 60
_KEEPALIVE_INTERVAL_S = 15
_KEEPALIVE_PROBES = 4


class WorkerChannels:
    """The listener, its acceptor thread, the loop's inbox and wake-up pipe, and sends.

    ``bind_host`` is the one address the listener binds: loopback for the local backend,
    the driver node's address on a cluster (never every interface). With ``tls`` the
    channel is encrypted with a certificate made for this run (:mod:`cairn._src.wire.tls`);
    :attr:`certificate_pem` is then what workers must trust (``certificate`` gives one
    made beforehand, and implies TLS). ``same_host(peer, bind_host)`` tells which peers
    run on the driver's machine: without TLS, sends to any other peer carry no storage
    credentials (:mod:`channel_security`). Authenticated connections go to ``inbox``
    (the controller loop's; one of its own when none is given).
    """

    def __init__(self, bind_host: str, *, inbox: Inbox | None = None, tls: bool = False,
                 certificate: RunCertificate | None = None,
                 same_host: Callable[[str, str], bool] = is_same_host) -> None:
        self.authkey = secrets.token_bytes(32)
        self.bind_host = bind_host
        if certificate is None and tls:
            certificate = make_run_certificate(bind_host)
        self._certificate = certificate
        self._same_host = same_host
        self.refusals = RefusalLog()
        self._stripped_for: set[str] = set()
        self._secrets_for: set[str] = set()
        self._stripped_lock = threading.Lock()
        family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
        self._listener = socket.create_server((bind_host, 0), family=family, backlog=128)
        self._owns_inbox = inbox is None
        self.inbox = inbox if inbox is not None else Inbox()
        self._closing = False
        self._handshakes = threading.BoundedSemaphore(_HANDSHAKES)
        self._acceptor = threading.Thread(target=self._accept_loop, name="cairn-acceptor",
                                          daemon=True)

    @property
    def certificate_pem(self) -> str | None:
        """The run's TLS certificate for workers to trust (None without TLS)."""
        return self._certificate.certificate_pem if self._certificate else None

    @property
    def address(self) -> tuple[str, int]:
        """The address the listener is bound to."""
        host, port = self._listener.getsockname()[:2]
        return str(host), int(port)

    @property
    def port(self) -> int:
        return int(self._listener.getsockname()[1])

    def start(self) -> None:
        self._acceptor.start()

    def _accept_loop(self) -> None:
        while not self._closing:
            try:
                # The handshake runs on a thread of its own, with a deadline, so a peer
                # that connects and says nothing (a port scan on a cluster node) cannot
                # hold up the workers behind it.
                sock, address = self._listener.accept()
            except OSError:
                if self._closing:
                    return
                continue
            self._handshakes.acquire()  # a slot frees within a handshake's deadline
            if self._closing:
                self._handshakes.release()
                sock.close()
                return
            try:
                threading.Thread(target=self._handshake, args=(sock, str(address[0])),
                                 name="cairn-handshake", daemon=True).start()
            except RuntimeError:  # no thread to be had: this peer is not served
                self._handshakes.release()
                sock.close()

    def _handshake(self, sock: socket.socket, peer: str) -> None:
        try:
            self._authenticate(sock, peer)
        finally:
            self._handshakes.release()

    def _authenticate(self, sock: socket.socket, peer: str) -> None:
        _enable_keepalive(sock)
        if self._certificate is not None:
            try:
                sock = open_server_tunnel(sock, self._certificate.server_context,
                                          _HANDSHAKE_TIMEOUT_S)
            except Exception as exc:
                if not self._closing:
                    self.refusals.refused(peer, f"TLS handshake failed: {exc}")
                return
        connection = self._wrap(sock, peer)
        deadline = threading.Timer(_HANDSHAKE_TIMEOUT_S, abort_connection, (connection,))
        deadline.start()
        try:
            deliver_challenge(connection, self.authkey)
            answer_challenge(connection, self.authkey)
            disable_nagle(connection)
            _, rank, pid, attempt = connection.recv()  # the worker's hello
            hello = NewConnection(connection, int(rank), int(pid), int(attempt))
            _set_receive_timeout(connection, RECEIVE_TIMEOUT_S)
        except Exception as exc:
            connection.close()
            if not self._closing:
                # A peer without the run's secret, or one that stalled or hung up (an
                # EOFError says nothing of its own), or a hello that is not a worker's.
                self.refusals.refused(peer, str(exc) or f"{type(exc).__name__}: it hung up "
                                      "or stalled before the handshake ended")
            return
        finally:
            deadline.cancel()
        self.inbox.post(hello)

    def _wrap(self, sock: socket.socket, peer: str) -> Connection:
        if self._certificate is not None or self._same_host(peer, self.bind_host):
            return Connection(sock.detach())

        def stripped() -> None:
            with self._stripped_lock:
                if peer in self._stripped_for:
                    return
                self._stripped_for.add(peer)
            logger.warning(
                "The control channel to %s (another machine) is not encrypted, so the "
                "credentials in the storage URI are not sent to it: workers there reach "
                "the storage with the credentials of their own environment. To send them, "
                "turn on TLS (ScalingConfig(tls=True) or CAIRN_TLS=1).", peer)

        def with_secrets(kind: str, names: tuple[str, ...]) -> None:
            with self._stripped_lock:
                if peer in self._secrets_for:
                    return
                self._secrets_for.add(peer)
            logger.warning(
                "The control channel to %s (another machine) is not encrypted, and the "
                "storage_filesystem object sent to its workers, a %s, holds explicit "
                "credentials (%s): they cross the network in clear. Pass a zero-argument "
                "factory that builds it from each node's environment, or turn on TLS "
                "(ScalingConfig(tls=True) or CAIRN_TLS=1).", peer, kind, ", ".join(names))

        return CredentialFreeConnection(sock.detach(), stripped, with_secrets)

    # --- the loop's side -----------------------------------------------------------------

    def read(self, attempt: Attempt, rank: int, connection: Connection,
             handle: Callable[[object], None], now: float, *,
             everything: bool = False) -> None:
        """Hand the rank's waiting messages to ``handle``; a broken connection is the
        rank's failure (its exit, when not seen yet, awaited from ``now``: see
        :data:`LOST_EXIT_GRACE_S`). Only receiving can break the connection: an error
        ``handle`` raises (a storage error of the driver's own) propagates, the connection
        kept."""
        # Bounded, so one chatty rank cannot hold up the others' exits and commits; after
        # the worker exited, everything it sent is read.
        read = 0
        while everything or read < _MESSAGES_PER_WAKE:
            try:
                if not connection.poll():
                    return
                message = connection.recv()
            except (EOFError, OSError):
                # OSError includes BlockingIOError: a message stalled RECEIVE_TIMEOUT_S
                # midway.
                self._lost(attempt, rank, connection, now)
                return
            handle(message)
            read += 1

    @staticmethod
    def _lost(attempt: Attempt, rank: int, connection: Connection, now: float) -> None:
        """The rank's connection broke: it went, unless already explained."""
        attempt.connections.pop(rank, None)
        connection.close()
        if attempt.went_unexplained(rank):
            worker = next(w for w in attempt.workers if w.rank == rank)
            exited = worker.wait_exit(0)
            attempt.failures.append(describe_lost(worker, exited))
            if not exited:
                attempt.exits_awaited[rank] = now + LOST_EXIT_GRACE_S

    def read_last_messages(self, attempt: Attempt, gone: list[WorkerHandle], clock: Clock,
                           handle: Callable[[object], None]) -> None:
        """Ranks exited: read what they sent before, all at once (a lost node's ranks
        wait out one grace, not one each). An exit can be reported before the last
        message is readable (Ray reports a finished actor task through its own channel):
        a rank is read until its Done, its error or the end of its connection, for at most
        ``LAST_MESSAGE_GRACE_S``, or ``RETURNED_GRACE_S`` for one whose last message may
        trail its end (a Ray task that returned)."""
        now = clock.monotonic()
        deadlines = {w.rank: now + (RETURNED_GRACE_S if w.last_message_may_trail
                                    else LAST_MESSAGE_GRACE_S) for w in gone}
        while True:
            now = clock.monotonic()
            waiting = {attempt.connections[rank]: rank for rank, until in deadlines.items()
                       if until > now and rank in attempt.connections
                       and rank not in attempt.done and not attempt.has_failure(rank)}
            if not waiting:
                return
            until = min(deadlines[rank] for rank in waiting.values())
            for connection in clock.wait(list(waiting), max(0.0, until - now)):
                self.read(attempt, waiting[connection], connection, handle,
                          clock.monotonic(), everything=True)

    def send(self, attempt: Attempt, rank: int, message: object) -> None:
        """Send to one worker; a worker gone meanwhile is left to the reader.

        A worker that finished sends Done and closes its end: a send after that fails,
        while its Done may still be unread in the socket. The connection stays, so the
        reader (or the exit watcher, which reads everything first) sees Done, or sees the
        end of the stream without one and records the rank's failure.
        """
        connection = attempt.connections.get(rank)
        if connection is None:
            return
        try:
            connection.send(message)
        except OSError as exc:
            logger.debug("Could not send to rank %d (%s); its messages are read first",
                         rank, exc)

    def broadcast(self, attempt: Attempt, message: object) -> None:
        for rank in list(attempt.connections):
            self.send(attempt, rank, message)

    # --- closing -------------------------------------------------------------------------

    def stop_accepting(self) -> None:
        self._closing = True
        try:
            # accept() does not return when the listener closes under it: knock once.
            socket.create_connection((self.bind_host, self.port), 5).close()
        except OSError:
            pass
        self._acceptor.join(5.0)
        self.refusals.summarize()

    def close(self) -> None:
        """Close the listener (after :meth:`stop_accepting`), and the inbox if it is this
        object's own."""
        self._listener.close()
        if self._owns_inbox:
            self.inbox.close()


def _enable_keepalive(sock: socket.socket) -> None:
    """TCP keepalive on an accepted connection (before any TLS tunnel: on its TCP end)."""
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for option, value in (("TCP_KEEPIDLE", _KEEPALIVE_IDLE_S),
                              ("TCP_KEEPINTVL", _KEEPALIVE_INTERVAL_S),
                              ("TCP_KEEPCNT", _KEEPALIVE_PROBES)):
            if hasattr(socket, option):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
    except OSError as exc:
        logger.debug("Could not turn on TCP keepalive: %s", exc)


def _set_receive_timeout(connection: Connection, seconds: float) -> None:
    """Make a blocking read of ``connection`` fail (``BlockingIOError``) after ``seconds``
    without new bytes; sends are left blocking."""
    whole = int(seconds)
    value = struct.pack("ll", whole, int((seconds - whole) * 1e6))
    sock = socket.socket(fileno=os.dup(connection.fileno()))
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
    finally:
        sock.close()
