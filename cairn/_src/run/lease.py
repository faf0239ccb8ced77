"""The run lease: at most one live driver per run, and a fence for the one that lost it.

A driver writes ``lease.json`` (host, pid, a random token, a heartbeat time, a ttl and a
generation) when it starts and renews it every ``ttl_s / 3`` seconds.

* **Who may take a lease.** A lease is live while its heartbeat is younger than its ttl and,
  on this host, its process still exists (a driver killed with ``kill -9`` on this host is
  taken over at once). A heartbeat older than the ttl means its driver is gone whatever
  the pid says (pids are reused). An invalid lease (pid 0 or below, a ttl of 0, below or
  above :data:`MAX_TTL_S`, a heartbeat further in the future than its ttl, wrong types, a
  number beyond a double's range, a generation of more than 12 digits) is taken over too,
  with a warning naming what is wrong. ``cairn lease break RUN`` clears a
  lease by hand (one whose heartbeat is fresh only with ``--force``).
* **Two drivers starting together.** Each new holder claims the next generation by
  creating ``_cairn_lease.<generation>`` exclusively (``O_EXCL`` on a local or POSIX file
  system): of two drivers that read the lease as free at once, one creates the claim and
  the other is refused. Stores without an exclusive create fall back to a write and a
  read-back of the token, which catches most interleavings, and rely on the fence.
* **The fence.** :meth:`RunLease.fence` raises :class:`RunLeaseError` once another driver
  holds the lease; the checkpoint manager calls it right before every index write (and
  before a commit writes its manifest), so a driver whose lease was taken over stops
  committing at once instead of writing over the new holder's index.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import secrets
import socket
import threading
import time
from dataclasses import asdict, dataclass

from cairn._src.errors import CairnError, ManifestError, RunLeaseError
from cairn._src.processes import process_exists
from cairn._src.run.layout import LEASE_NAME
from cairn._src.run.schema import MAX_LEASE_GENERATION, parse_lease, short_repr
from cairn._src.storage.fileio import delete_file, list_dir_names, read_bytes, write_bytes_atomic
from cairn._src.storage.location import StorageLocation
from cairn._src.storage.retry import RetryPolicy
from cairn._src.storage.uris import local_os_join, local_root

logger = logging.getLogger(__name__)

LEASE_VERSION = 1
CLAIM_PREFIX = "_cairn_lease."
_CLAIM_DIGITS = len(str(MAX_LEASE_GENERATION))
_SHOWN = 3
# A ttl above this is not one Cairn writes (the default is 30 s): such a lease is invalid.
MAX_TTL_S = 3600.0
_SETTLE_S = 0.05
BREAK_HINT = ("`cairn lease break {run}` clears it by hand once no driver runs it (with --force "
              "while its heartbeat is fresh)")


@dataclass(frozen=True)
class LeaseInfo:
    host: str
    pid: int
    token: str
    heartbeat_at: float
    ttl_s: float
    generation: int = 0

    def to_json(self) -> bytes:
        return json.dumps({"version": LEASE_VERSION, **asdict(self)}).encode()

    @classmethod
    def from_json(cls, data: bytes, *, where: str = LEASE_NAME) -> LeaseInfo:
        """The lease in ``data``; :class:`ManifestError` when it is not one Cairn wrote."""
        body = parse_lease(data, where=where)
        return cls(host=body["host"], pid=int(body["pid"]), token=body["token"],
                   heartbeat_at=float(body["heartbeat_at"]), ttl_s=float(body["ttl_s"]),
                   generation=int(body.get("generation", 0)))


def lease_problem(lease: LeaseInfo, *, now: float | None = None) -> str | None:
    """Why ``lease`` cannot be a lease a live driver holds, or None when it could be."""
    now = time.time() if now is None else now
    if lease.pid <= 0:
        return f"its pid is {lease.pid}"
    if not 0 < lease.ttl_s <= MAX_TTL_S:
        return f"its ttl_s is {lease.ttl_s:g} (a lease has 0 < ttl_s <= {MAX_TTL_S:g})"
    if lease.heartbeat_at - now > lease.ttl_s:
        return (f"its heartbeat is {lease.heartbeat_at - now:.0f}s in the future, more than "
                f"its ttl of {lease.ttl_s:g}s")
    return None


def is_live(lease: LeaseInfo, *, now: float | None = None) -> bool:
    """Whether the driver named by ``lease`` may still be running.

    A heartbeat older than the ttl means gone, whatever the pid (it may be reused). On this
    host a dead process settles it at once. An invalid lease is never live.
    """
    now = time.time() if now is None else now
    if lease_problem(lease, now=now) is not None:
        return False
    if now - lease.heartbeat_at >= lease.ttl_s:
        return False
    if lease.host == socket.gethostname() and lease.pid != os.getpid():
        return process_exists(lease.pid)
    return True


def _claim_exclusively(location: StorageLocation) -> bool | None:
    """Create ``location`` if absent: True when created, False when it existed, None when
    the store has no exclusive create."""
    root = local_root(location.filesystem)
    if root is None:
        return None
    path = local_os_join(root, location.path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            return None
        raise
    os.close(fd)
    return True


def claim_names(run: StorageLocation, retry: RetryPolicy) -> dict[int, str]:
    """generation -> name of the claim files in ``run``.

    A claim is named as a driver names it: :data:`CLAIM_PREFIX` and the generation in
    ASCII digits, without leading zeros, at most :data:`MAX_LEASE_GENERATION` (12 digits).
    Other names are ignored, whatever a listing returns (``..``, control characters,
    digits of other scripts, a number of 243 digits that would make the next claim's name
    longer than a file system takes); those that start like a claim are counted in one
    warning.
    """
    claims = {}
    foreign = []
    for name in list_dir_names(run, retry):
        if not name.startswith(CLAIM_PREFIX):
            continue
        suffix = name[len(CLAIM_PREFIX):]
        if (0 < len(suffix) <= _CLAIM_DIGITS and suffix.isascii() and suffix.isdigit()
                and str(int(suffix)) == suffix):
            claims[int(suffix)] = name
        else:
            foreign.append(name)
    if foreign:
        shown = ", ".join(short_repr(name) for name in foreign[:_SHOWN])
        logger.warning(
            "Ignoring %d names under %s that are not lease claims Cairn wrote (%s<generation>: "
            "1 to %d ASCII digits, no leading zeros): %s%s", len(foreign),
            run.display(), CLAIM_PREFIX, _CLAIM_DIGITS, shown,
            ", ..." if len(foreign) > _SHOWN else "")
    return claims


def break_lease(run: StorageLocation, retry: RetryPolicy) -> LeaseInfo | None:
    """Clear the lease of ``run`` and its claims (``cairn lease break``); the lease that was
    there, if it could be read."""
    location = run.join(LEASE_NAME)
    previous: LeaseInfo | None = None
    try:
        previous = LeaseInfo.from_json(read_bytes(location, retry), where=location.display())
    except (FileNotFoundError, ManifestError):
        pass
    try:
        delete_file(location, retry)
    except FileNotFoundError:
        pass
    for name in claim_names(run, retry).values():
        delete_file(run.join(name), retry)
    return previous


class RunLease:
    """Holds the lease of one run while a driver runs it."""

    def __init__(self, run: StorageLocation, retry: RetryPolicy, *, ttl_s: float = 30.0) -> None:
        self._run = run
        self._location = run.join(LEASE_NAME)
        self._retry = retry
        self._ttl_s = ttl_s
        self._token = secrets.token_hex(16)
        self._generation = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lost: RunLeaseError | None = None

    @property
    def generation(self) -> int:
        return self._generation

    def _read(self) -> LeaseInfo | None:
        try:
            return LeaseInfo.from_json(read_bytes(self._location, self._retry),
                                       where=self._location.display())
        except FileNotFoundError:
            return None

    def _read_settled(self) -> LeaseInfo | None:
        """The lease as :meth:`_read` gives it, read again with backoff while it does not
        parse: an object store may hand back a torn read of the object this driver is
        rewriting at that moment (seen with an S3-protocol server). A lease that stays
        malformed is not this driver's: :class:`ManifestError` propagates."""
        attempts = max(3, self._retry.max_attempts)
        for attempt in range(attempts):
            try:
                return self._read()
            except ManifestError:
                if attempt == attempts - 1:
                    raise
                logger.debug("The lease of %s did not parse; reading it again",
                             self._run_text())
                time.sleep(self._retry.backoff(attempt))
        raise AssertionError("unreachable")

    def _write(self) -> None:
        info = LeaseInfo(socket.gethostname(), os.getpid(), self._token, time.time(),
                         self._ttl_s, self._generation)
        write_bytes_atomic(self._location, info.to_json(), self._retry)

    def _run_text(self) -> str:
        return self._location.display().rsplit("/", 1)[0]

    def acquire(self) -> None:
        """Take the lease or raise :class:`RunLeaseError` naming the holder."""
        try:
            current = self._read()
        except ManifestError as exc:
            logger.warning("Taking over the lease of %s: %s", self._run_text(), exc)
            current = None
        if current is not None and current.token != self._token:
            problem = lease_problem(current)
            if problem is not None:
                logger.warning("Taking over an invalid lease of %s (host %s, pid %d): %s",
                               self._run_text(), current.host, current.pid, problem)
            elif is_live(current):
                raise RunLeaseError(
                    f"The run at {self._run_text()} is held by another live driver (host "
                    f"{current.host}, pid {current.pid}). Wait for it to finish, stop it, "
                    f"or give this run another RunConfig.name; "
                    f"{BREAK_HINT.format(run=self._run_text())}."
                )
            else:
                logger.warning("Taking over the lease of a driver that is gone (host %s, "
                               "pid %d, heartbeat %.0fs old)", current.host, current.pid,
                               time.time() - current.heartbeat_at)
        claims = claim_names(self._run, self._retry)
        last = max([current.generation if current else 0, *claims])
        if last >= MAX_LEASE_GENERATION:
            # Only a planted claim or lease gets here (a driver adds one per start).
            holder = claims.get(last, LEASE_NAME)
            raise RunLeaseError(
                f"The run at {self._run_text()} holds {short_repr(holder)} with lease "
                f"generation {last}, the last one Cairn counts to ({MAX_LEASE_GENERATION}): "
                "it is not a file a driver wrote, and no later generation can be claimed; "
                f"{BREAK_HINT.format(run=self._run_text())} (the lease and its claims)."
            )
        self._generation = last + 1
        claimed = _claim_exclusively(self._run.join(f"{CLAIM_PREFIX}{self._generation}"))
        if claimed is False:
            raise RunLeaseError(
                f"Another driver took the lease of the run at {self._run_text()} at the same "
                "time (it claimed the same lease generation). Only one driver may run it."
            )
        self._write()
        # Without an exclusive create, a driver that read the lease as free at the same
        # moment writes within this window; reading back after it leaves one of the two.
        time.sleep(_SETTLE_S)
        check = self._read()
        if check is None or check.token != self._token:
            holder = f"host {check.host}, pid {check.pid}" if check else "unknown"
            raise RunLeaseError(
                f"Another driver ({holder}) took the lease of this run at the same time. "
                "Only one driver may run it."
            )
        for generation, name in claims.items():
            if generation < self._generation:
                try:
                    delete_file(self._run.join(name), self._retry)
                except Exception:
                    logger.debug("Could not delete the old lease claim %s", name, exc_info=True)
        self._thread = threading.Thread(target=self._renew, name="cairn-lease", daemon=True)
        self._thread.start()

    def fence(self) -> None:
        """Raise :class:`RunLeaseError` when another driver holds the lease now.

        Reads the lease (one small read): called right before the index is written, so a
        driver that lost its lease writes no index over the new holder's.
        """
        if self._lost is None:
            current = self._read_settled()
            if current is None or current.token != self._token:
                self._lost = self._lost_error(current)
        if self._lost is not None:
            raise self._lost

    def _lost_error(self, current: LeaseInfo | None) -> RunLeaseError:
        if current is None:
            return RunLeaseError(
                f"This driver's lease of the run at {self._run_text()} was removed while it "
                "ran (by `cairn lease break --force`, or by hand) and no driver holds the run "
                "now, so this driver stopped committing checkpoints. fit() again with the "
                "same name and storage_path continues the run from its latest committed "
                "checkpoint."
            )
        return RunLeaseError(
            f"This driver lost the lease of the run at {self._run_text()} (now held by "
            f"driver host {current.host}, pid {current.pid}), so it stopped committing "
            "checkpoints. That driver took the run over because this one's heartbeat was not "
            "renewed in time (a paused process or slow storage) or its lease was broken by "
            "hand; the run continues under that driver."
        )

    def _renew(self) -> None:
        while not self._stop.wait(self._ttl_s / 3):
            try:
                current = self._read_settled()
                if current is None or current.token != self._token:
                    # Someone took the run over (this driver looked dead to it): stop
                    # renewing rather than fight over the lease; the fence stops commits.
                    self._lost = self._lost_error(current)
                    logger.error("%s", self._lost)
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
                delete_file(self._run.join(f"{CLAIM_PREFIX}{self._generation}"), self._retry)
        except (CairnError, OSError):
            logger.warning("Could not release the run lease", exc_info=True)
