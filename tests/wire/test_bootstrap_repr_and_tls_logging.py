"""Secrets stay out of reprs, and a peer that sends bad TLS records is logged once per
address: real sockets where the behaviour involves them."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator

import pytest
from channel_support import EVENT_TIMEOUT_S

from cairn._src.controller.connections import WorkerChannels
from cairn._src.wire.bootstrap import Bootstrap
from cairn._src.wire.tls import client_context

# A TLS 1.3 application-data record whose authentication tag cannot be right.
_FORGED_RECORD = b"\x17\x03\x03\x00\x40" + bytes(range(0x40))


def test_a_bootstrap_repr_shows_no_secret() -> None:
    authkey = bytes(range(32))
    text = repr(Bootstrap(("127.0.0.1", 5000), authkey, 3, tls_certificate="PEM"))
    assert repr(authkey) not in text and authkey.hex() not in text
    assert "127.0.0.1" in text and "attempt=3" in text


@pytest.fixture
def tls_channels() -> Iterator[WorkerChannels]:
    channels = WorkerChannels("127.0.0.1", tls=True)
    channels.start()
    yield channels
    channels.stop_accepting()
    channels.close()


def test_a_peer_sending_bad_tls_records_is_logged_once_per_address(
    tls_channels: WorkerChannels, caplog: pytest.LogCaptureFixture,
) -> None:
    # Anyone may finish a TLS handshake (the run's certificate is public); only the run's
    # secret, asked for inside the tunnel, lets a worker in.
    caplog.set_level(logging.WARNING, logger="cairn")
    assert tls_channels.certificate_pem is not None
    context = client_context(tls_channels.certificate_pem)
    peers = []
    for count in range(1, 6):
        tls = context.wrap_socket(socket.create_connection(("127.0.0.1", tls_channels.port)))
        tls.recv(1)  # the controller's challenge has started: the handshake is over
        raw = socket.socket(fileno=os.dup(tls.fileno()))
        raw.sendall(_FORGED_RECORD)
        peers.extend((tls, raw))
        assert tls_channels.refusals.wait_for(count, EVENT_TIMEOUT_S)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "127.0.0.1" in warnings[0].getMessage()
    for peer in peers:
        peer.close()
