"""The controller's listener under connections that never become workers: a bounded number
of handshakes at once, and a refusal that says why when the peer said nothing. Real
sockets."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterator

import pytest
from channel_support import EVENT_TIMEOUT_S, connect_worker

from cairn._src.controller import connections
from cairn._src.controller.connections import WorkerChannels


@pytest.fixture
def channels() -> Iterator[WorkerChannels]:
    channels = WorkerChannels("127.0.0.1")
    channels.start()
    yield channels
    channels.stop_accepting()
    channels.close()


def test_a_flood_of_silent_connections_takes_a_bounded_number_of_handshakes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connections, "_HANDSHAKES", 3)
    monkeypatch.setattr(connections, "_HANDSHAKE_TIMEOUT_S", 0.2)
    lock = threading.Lock()
    running = [0, 0]  # now, most at once
    real = WorkerChannels._authenticate

    def counted(self: WorkerChannels, sock: socket.socket, peer: str) -> None:
        with lock:
            running[0] += 1
            running[1] = max(running[1], running[0])
        try:
            real(self, sock, peer)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(WorkerChannels, "_authenticate", counted)
    channels = WorkerChannels("127.0.0.1")
    channels.start()
    silent = [socket.create_connection(("127.0.0.1", channels.port), EVENT_TIMEOUT_S)
              for _ in range(10)]
    try:
        # Each says nothing until its handshake's deadline: all ten are refused in turn.
        assert channels.refusals.wait_for(10, EVENT_TIMEOUT_S)
        assert running[1] == 3
        # A worker still gets in afterwards.
        worker, controller = connect_worker(channels)
        worker.send("hi")
        assert controller.recv() == "hi"
    finally:
        for sock in silent:
            sock.close()
        channels.stop_accepting()
        channels.close()


def test_a_peer_that_hangs_up_is_refused_with_a_reason(
        channels: WorkerChannels, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="cairn")
    socket.create_connection(("127.0.0.1", channels.port), EVENT_TIMEOUT_S).close()
    assert channels.refusals.wait_for(1, EVENT_TIMEOUT_S)
    [line] = [r.getMessage() for r in caplog.records if "Refused" in r.getMessage()]
    assert ("Refused a connection to the controller from 127.0.0.1: EOFError: it hung up or "
            "stalled before the handshake ended") in line
