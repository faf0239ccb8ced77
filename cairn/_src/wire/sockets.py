"""Socket settings both ends of the control channel apply, and a read that a close in
this process ends cleanly."""

from __future__ import annotations

import os
import socket
import struct
from multiprocessing.connection import Connection
from typing import Any


def disable_nagle(connection: Any) -> None:
    """Send small messages at once on a TCP connection.

    Reports are small messages sent back to back; with Nagle's algorithm on, the second
    waits for the peer's delayed ACK (about 40 ms on Linux).
    """
    try:
        sock = socket.socket(fileno=os.dup(connection.fileno()))
    except OSError:
        return
    try:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    finally:
        sock.close()


def abort_connection(connection: Any) -> None:
    """Wake any thread blocked reading ``connection``: it sees the end of the stream."""
    try:
        sock = socket.socket(fileno=os.dup(connection.fileno()))
    except OSError:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.close()


def set_io_timeout(connection: Any, seconds: float) -> None:
    """Make each blocking read or write on ``connection`` fail (``BlockingIOError``) once
    it has waited ``seconds`` for the peer: a peer that stalls, mid-message included,
    cannot hold the reader forever."""
    whole = int(seconds)
    value = struct.pack("ll", whole, int((seconds - whole) * 1e6))
    sock = socket.socket(fileno=os.dup(connection.fileno()))
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
    finally:
        sock.close()


def receive(connection: Connection) -> Any:
    """``connection.recv()``, where a close of ``connection`` by another thread of this
    process, racing the read, raises ``EOFError``, as the end of the stream does.

    ``Connection.close()`` sets the handle to None, so a read that started before the
    close fails with ``TypeError`` (``OSError`` once the read starts after it). A
    ``TypeError`` while the connection is open (a message that does not unpickle) is
    raised as it is."""
    try:
        return connection.recv()
    except TypeError as exc:
        if not connection.closed:
            raise
        raise EOFError("the connection was closed in this process") from exc
