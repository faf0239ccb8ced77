"""Where the controller listens, and how refused peers are logged: real sockets."""

from __future__ import annotations

import logging
import socket
from multiprocessing.connection import AuthenticationError, Client

import pytest
from channel_support import EVENT_TIMEOUT_S, connect_worker

from cairn._src.controller.connections import WorkerChannels


@pytest.fixture
def channels() -> WorkerChannels:
    channels = WorkerChannels("127.0.0.1")
    channels.start()
    yield channels
    channels.stop_accepting()
    channels.close()


def _refusal_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.WARNING and "Refused" in r.getMessage()]


def test_a_bad_key_peer_connecting_five_times_is_logged_once(
    channels: WorkerChannels, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="cairn")
    for _ in range(5):
        with pytest.raises(AuthenticationError):
            Client(("127.0.0.1", channels.port), authkey=b"not the run's secret")
    assert channels.refusals.wait_for(5, EVENT_TIMEOUT_S)
    lines = _refusal_lines(caplog)
    assert len(lines) == 1, lines
    assert lines[0].startswith("Refused a connection to the controller from 127.0.0.1: ")
    assert "further refusals from this address are logged at debug level" in lines[0]
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG
             and r.getMessage().startswith("Refused connection ")]
    assert len(debug) == 4
    # A worker with the secret still gets in, and the total is summed up at the end.
    worker, controller = connect_worker(channels)
    worker.send("hi")
    assert controller.recv() == "hi"
    channels.stop_accepting()
    assert "Refused 5 connections to the controller from 127.0.0.1 in all" in _refusal_lines(
        caplog)


def test_each_peer_address_is_logged_once(
    channels: WorkerChannels, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="cairn")
    for source in ("127.0.0.2", "127.0.0.3", "127.0.0.2"):
        sock = socket.create_connection(("127.0.0.1", channels.port), EVENT_TIMEOUT_S,
                                        source_address=(source, 0))
        sock.close()  # hangs up before answering the challenge
    assert channels.refusals.wait_for(3, EVENT_TIMEOUT_S)
    assert channels.refusals.counts() == {"127.0.0.2": 2, "127.0.0.3": 1}
    lines = _refusal_lines(caplog)
    assert sorted(line.split(":")[0] for line in lines) == [
        "Refused a connection to the controller from 127.0.0.2",
        "Refused a connection to the controller from 127.0.0.3",
    ]


def _routable_address() -> str | None:
    """An address of this machine other than loopback, if it has one."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # no packet is sent for a UDP connect
        address = str(probe.getsockname()[0])
    except OSError:
        return None
    finally:
        probe.close()
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def test_the_listener_binds_one_address_never_every_interface() -> None:
    channels = WorkerChannels("127.0.0.1")
    try:
        assert channels.address[0] == "127.0.0.1"
    finally:
        channels.close()
    address = _routable_address()
    if address is None:
        pytest.skip("this machine has no address besides loopback")
    channels = WorkerChannels(address)
    channels.start()
    try:
        assert channels.address[0] == address
        # Not on loopback: only the driver node's address answers.
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", channels.port), EVENT_TIMEOUT_S)
        worker, controller = connect_worker(channels)
        worker.send("over the node's address")
        assert controller.recv() == "over the node's address"
    finally:
        channels.stop_accepting()
        channels.close()
