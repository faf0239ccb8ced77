"""The run lease: at most one live driver per run.

A driver writes ``lease.json`` (host, pid, a random token, a heartbeat time) when it
starts and renews it every ``ttl_s / 3`` seconds. Another driver is refused while the
lease is live: its process still exists (same host) or its heartbeat is younger than the
TTL (another host). A lease whose driver is dead is taken over. The write is followed by a
read-back of the token, which catches most races between two drivers starting together;
storage without a conditional write cannot rule out every interleaving.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from cairn._src.errors import RunLeaseError
from cairn._src.run.layout import LEASE_NAME
from cairn._src.storage.fileio import delete_file, read_bytes, write_bytes_atomic
from cairn._src.storage.location import StorageLocation
from cairn._src.storage.retry import RetryPolicy

logger = logging.getLogger(__name__)

LEASE_VERSION = 1
_SETTLE_S = 0.05


@dataclass(frozen=True)
class LeaseInfo:
    host: str
    pid: int
    token: str
    heartbeat_at: float
    ttl_s: float

    def to_json(self) -> bytes:
        return json.dumps({"version": LEASE_VERSION, **self.__dict__}).encode()

    @classmethod
    def from_json(cls, data: bytes) -> LeaseInfo | None:
        try:
            body: dict[str, Any] = json.loads(data)
            return cls(
                host=str(body["host"]),
                pid=int(body["pid"]),
                token=str(body["token"]),
                heartbeat_at=float(body["heartbeat_at"]),
                ttl_s=float(body["ttl_s"]),
            )
        except (ValueError, KeyError, TypeError):
            return None


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_live(lease: LeaseInfo, *, now: float | None = None) -> bool:
    """Whether the driver named by ``lease`` may still be running.

    On this host a dead process settles it at once (a driver killed with ``kill -9`` is
    taken over without waiting for its heartbeat to age). Otherwise, and for another
    ``fit()`` in this very process, a heartbeat younger than the TTL means live.
    """
    fresh = (now or time.time()) - lease.heartbeat_at < lease.ttl_s
    if lease.host == socket.gethostname() and lease.pid != os.getpid():
        return _process_exists(lease.pid)
    return fresh


class RunLease:
    """Holds the lease of one run while a driver runs it."""

    def __init__(self, run: StorageLocation, retry: RetryPolicy, *, ttl_s: float = 30.0) -> None:
        self._location = run.join(LEASE_NAME)
        self._retry = retry
        self._ttl_s = ttl_s
        self._token = secrets.token_hex(16)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _read(self) -> LeaseInfo | None:
        try:
            return LeaseInfo.from_json(read_bytes(self._location, self._retry))
        except FileNotFoundError:
            return None

    def _write(self) -> None:
        info = LeaseInfo(socket.gethostname(), os.getpid(), self._token, time.time(), self._ttl_s)
        write_bytes_atomic(self._location, info.to_json(), self._retry)

    def acquire(self) -> None:
        """Take the lease or raise :class:`RunLeaseError` naming the holder."""
        current = self._read()
        if current is not None and current.token != self._token and is_live(current):
            raise RunLeaseError(
                f"The run at {self._location.display().rsplit('/', 1)[0]} is held by another "
                f"live driver (host {current.host}, pid {current.pid}). Wait for it to finish, "
                "stop it, or give this run another RunConfig.name."
            )
        if current is not None:
            logger.info("Taking over the lease of a dead driver (host %s, pid %d)",
                        current.host, current.pid)
        self._write()
        # A driver that read the lease as free at the same moment writes within this
        # window; reading back after it leaves one of the two holding the lease.
        time.sleep(_SETTLE_S)
        check = self._read()
        if check is None or check.token != self._token:
            holder = f"host {check.host}, pid {check.pid}" if check else "unknown"
            raise RunLeaseError(
                f"Another driver ({holder}) took the lease of this run at the same time. "
                "Only one driver may run it."
            )
        self._thread = threading.Thread(target=self._renew, name="cairn-lease", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(self._ttl_s / 3):
            try:
                current = self._read()
                if current is not None and current.token != self._token:
                    # Someone took the run over (this driver looked dead to it): stop
                    # renewing rather than fight over the lease; the error names the cause.
                    logger.error("Another driver (host %s, pid %d) took over the lease of "
                                 "this run; this driver no longer holds it", current.host,
                                 current.pid)
                    return
                self._write()
            except Exception:
                logger.warning("Could not renew the run lease", exc_info=True)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        try:
            current = self._read()
            if current is not None and current.token == self._token:
                delete_file(self._location, self._retry)
        except Exception:
            logger.warning("Could not release the run lease", exc_info=True)
