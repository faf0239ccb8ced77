"""The worker's connection to the controller, against real listeners on loopback: an
address that accepts the connection but never answers the authentication handshake
(plain or inside TLS) fails with an error naming it, instead of blocking the worker for
good; a connection made in time is handed back without any timeout left on it."""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection, Listener
from typing import Any

import pytest

from cairn._src.wire.tls import RunCertificate, make_run_certificate, open_server_tunnel
from cairn._src.worker import main as worker_main

AUTHKEY = os.urandom(32)
# Bounds a wait for the test's own listener thread; never reached when the code works.
EVENT_TIMEOUT_S = 60.0


def _boot(address: tuple[str, int], certificate: str | None = None) -> dict[str, Any]:
    boot: dict[str, Any] = {"address": list(address), "authkey": AUTHKEY.hex()}
    if certificate is not None:
        boot["tls_certificate"] = certificate
    return boot


def _serve_one(handle: Callable[[socket.socket], Any]) -> Iterator[tuple[str, int]]:
    """A listener on 127.0.0.1 that accepts one connection and hands it to ``handle``;
    what ``handle`` returns stays open until the test ends."""
    listener = socket.create_server(("127.0.0.1", 0))
    kept: list[Any] = []

    def accept() -> None:
        listener.settimeout(EVENT_TIMEOUT_S)
        try:
            accepted, _ = listener.accept()
        except OSError:
            return
        accepted.settimeout(None)
        kept.append(handle(accepted))

    thread = threading.Thread(target=accept, name="test-listener", daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[:2]
    finally:
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)  # wakes an accept still waiting
        listener.close()
        thread.join(EVENT_TIMEOUT_S)
        for item in kept:
            item.close()


@pytest.fixture
def short_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_main, "_CONNECT_TIMEOUT_S", 0.2)


@pytest.fixture
def mute_controller() -> Iterator[tuple[str, int]]:
    """Accepts the TCP connection and never sends the challenge."""
    yield from _serve_one(lambda accepted: accepted)


@pytest.fixture
def certificate() -> RunCertificate:
    return make_run_certificate("127.0.0.1")


@pytest.fixture
def mute_tls_controller(certificate: RunCertificate) -> Iterator[tuple[str, int]]:
    """Completes the TLS handshake, then never sends the challenge inside the tunnel."""
    yield from _serve_one(
        lambda accepted: open_server_tunnel(accepted, certificate.server_context,
                                            EVENT_TIMEOUT_S))


@pytest.mark.usefixtures("short_timeout")
def test_a_controller_that_never_answers_the_handshake_times_out_naming_its_address(
    mute_controller: tuple[str, int],
) -> None:
    host, port = mute_controller
    with pytest.raises(TimeoutError, match=rf"controller at {host}:{port}: its "
                                           "authentication handshake got no answer"):
        worker_main.connect(_boot(mute_controller))


@pytest.mark.usefixtures("short_timeout")
def test_a_tls_controller_that_never_sends_the_challenge_times_out_naming_its_address(
    mute_tls_controller: tuple[str, int], certificate: RunCertificate,
) -> None:
    host, port = mute_tls_controller
    # On a loaded machine the short bound may run out in the TLS handshake already.
    with pytest.raises(TimeoutError, match=rf"controller at {host}:{port}: its "
                                           "(TLS|authentication) handshake got no answer"):
        worker_main.connect(_boot(mute_tls_controller, certificate.certificate_pem))


def _io_timeouts(connection: Connection) -> tuple[bytes, bytes]:
    sock = socket.socket(fileno=os.dup(connection.fileno()))
    try:
        size = struct.calcsize("ll")
        return (sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, size),
                sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, size))
    finally:
        sock.close()


def test_a_connection_made_in_time_blocks_without_a_limit_and_sends_at_once() -> None:
    listener = Listener(("127.0.0.1", 0), authkey=AUTHKEY)
    accepted: list[Connection] = []
    thread = threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True)
    thread.start()
    worker = worker_main.connect(_boot(listener.address))
    try:
        thread.join(EVENT_TIMEOUT_S)
        assert accepted, "the listener did not authenticate the worker"
        no_timeout = struct.pack("ll", 0, 0)
        assert _io_timeouts(worker) == (no_timeout, no_timeout)
        assert os.get_blocking(worker.fileno())
        sock = socket.socket(fileno=os.dup(worker.fileno()))
        try:
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        finally:
            sock.close()
        worker.send({"ping": 1})
        assert accepted[0].recv() == {"ping": 1}
        accepted[0].send("pong")
        assert worker.recv() == "pong"
    finally:
        worker.close()
        for connection in accepted:
            connection.close()
        listener.close()
