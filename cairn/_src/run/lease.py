"""The run lease: at most one live driver per run, and a fence for the one that lost it.

A driver writes ``lease.json`` (host, pid, the PID namespace its pid belongs to, a random
token, a heartbeat time, a ttl and a generation) when it starts and renews it every
``ttl_s / 3`` seconds.

* **Who may take a lease.** A lease is live while its heartbeat is younger than its ttl and,
  when it names this host and this process's PID namespace (see :func:`pid_namespace`), its
  process still exists (a driver killed with ``kill -9`` here is taken over at once). A
  lease of the same host name from another PID namespace (a container with the host's
  network, a Kubernetes ``hostNetwork`` pod), of a system without ``/proc``, or written
  before leases named their namespace is judged by its heartbeat alone: its pid means
  nothing here. A heartbeat older than the ttl means its driver is gone whatever
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
from cairn._src.storage.fileio import (
    delete_file,
    is_dir,
    is_local_link,
    list_dir_names,
    read_bytes,
    write_bytes_atomic,
)
from cairn._src.storage.location import StorageLocation
from cairn._src.storage.retry import RetryPolicy
from cairn._src.storage.uris import local_os_join, local_root
from cairn._src.text import printable

logger = logging.getLogger(__name__)

LEASE_VERSION = 1
CLAIM_PREFIX = "_cairn_lease."
_CLAIM_DIGITS = len(str(MAX_LEASE_GENERATION))
_SHOWN = 3
# A ttl above this is not one Cairn writes (the default is 30 s): such a lease is invalid.
MAX_TTL_S = 3600.0
_SETTLE_S = 0.05
# Where Linux says which PID namespace a process is in, and which boot of the kernel this is.
_PID_NAMESPACE_PATH = "/proc/self/ns/pid"
_BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
# A pid_namespace read back longer than this is not one Cairn wrote: judged as none.
_MAX_NAMESPACE_CHARS = 200
_MAX_HOST_SHOWN = 100
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
    # Which pids ``pid`` is one of (:func:`pid_namespace`); None: unknown (heartbeat only).
    pid_namespace: str | None = None

    def to_json(self) -> bytes:
        return json.dumps({"version": LEASE_VERSION, **asdict(self)}).encode()

    @classmethod
    def from_json(cls, data: bytes, *, where: str = LEASE_NAME) -> LeaseInfo:
        """The lease in ``data``; :class:`ManifestError` when it is not one Cairn wrote."""
        body = parse_lease(data, where=where)
        # Optional, and a lease is judged without it (by its heartbeat): a lease written
        # before the field, or one with a value of the wrong type, is still a lease.
        namespace = body.get("pid_namespace")
        if not (isinstance(namespace, str) and 0 < len(namespace) <= _MAX_NAMESPACE_CHARS):
            namespace = None
        return cls(host=body["host"], pid=int(body["pid"]), token=body["token"],
                   heartbeat_at=float(body["heartbeat_at"]), ttl_s=float(body["ttl_s"]),
                   generation=int(body.get("generation", 0)), pid_namespace=namespace)


def shown_host(host: str) -> str:
    """``host``, read back from a lease (untrusted), as a message shows it: unprintable
    characters escaped as Python writes them (``\\n``, ``\\x1b``), cut to 100 characters."""
    text = printable(host)  # a newline would forge a log line, ESC drive the terminal
    return text if len(text) <= _MAX_HOST_SHOWN else text[:_MAX_HOST_SHOWN - 3] + "..."


def pid_namespace() -> str | None:
    """Which pids this process sees, as ``"<boot id>/<device>:<inode>"`` of its PID namespace
    (``/proc/self/ns/pid``) and the kernel's boot (``/proc/sys/kernel/random/boot_id``):
    two processes with the same value can see each other's pids. None where either cannot
    be read (a system without ``/proc``): then no lease's pid is judged here."""
    try:
        namespace = os.stat(_PID_NAMESPACE_PATH)
        with open(_BOOT_ID_PATH, encoding="ascii") as file:
            boot = file.read(100).strip()
    except (OSError, ValueError):
        return None
    return f"{boot}/{namespace.st_dev}:{namespace.st_ino}" if boot else None


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
    host, in this PID namespace, a dead process settles it at once; a lease from another
    PID namespace of the same host name (or one that does not say which) is judged by its
    heartbeat alone, since its pid may be a live process this one cannot see. An invalid
    lease is never live.
    """
    now = time.time() if now is None else now
    if lease_problem(lease, now=now) is not None:
        return False
    if now - lease.heartbeat_at >= lease.ttl_s:
        return False
    if (lease.host == socket.gethostname() and lease.pid != os.getpid()
            and lease.pid_namespace is not None and lease.pid_namespace == pid_namespace()):
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


def read_lease_settled(location: StorageLocation, retry: RetryPolicy) -> LeaseInfo | None:
    """The lease at ``location`` (None when there is none), read again with backoff while it
    does not parse: an object store may hand back a torn read of a lease its driver is
    rewriting at that moment (seen with an S3-protocol server). A lease that stays
    malformed raises :class:`ManifestError`."""
    attempts = max(3, retry.max_attempts)
    for attempt in range(attempts):
        try:
            return LeaseInfo.from_json(read_bytes(location, retry), where=location.display())
        except FileNotFoundError:
            return None
        except ManifestError:
            if attempt == attempts - 1:
                raise
            logger.debug("The lease %s did not parse; reading it again", location.display())
            time.sleep(retry.backoff(attempt))
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class LeaseState:
    """A run's lease as :func:`lease_state` read it, for :func:`break_lease` to remove only
    that: the lease (None: none, or none that parses) and the highest generation of the
    lease and the claims there then (a driver that starts later claims a higher one)."""

    lease: LeaseInfo | None
    generation: int


def lease_state(run: StorageLocation, retry: RetryPolicy) -> LeaseState:
    """The lease of ``run`` and its generation now, for :func:`break_lease`."""
    # The claims first: a driver claims its generation, then writes its lease.
    claims = claim_names(run, retry)
    try:
        lease = read_lease_settled(run.join(LEASE_NAME), retry)
    except ManifestError:
        lease = None
    return LeaseState(lease, max([lease.generation if lease is not None else 0, *claims]))


class LeaseChangedError(RunLeaseError):
    """:func:`break_lease` found another lease than the one judged; nothing was removed."""

    def __init__(self, run: StorageLocation, current: LeaseInfo) -> None:
        self.current = current
        super().__init__(
            f"The lease of the run at {run.display()} changed while `cairn lease break` "
            f"judged it (now held by host {shown_host(current.host)}, pid {current.pid}); nothing "
            "removed. Run it again to judge the lease there now.")


def break_lease(run: StorageLocation, retry: RetryPolicy, *,
                judged: LeaseState | None = None) -> LeaseInfo | None:
    """Clear the lease of ``run`` and its claims (``cairn lease break``); the lease that was
    there, if it could be read.

    ``judged``: the :func:`lease_state` the caller judged breakable. The lease is read
    again right before it is deleted, and when another one is there now (a driver started,
    or the judged one renewed its heartbeat) :class:`LeaseChangedError` is raised with
    nothing removed; only claims up to the judged generation are deleted, so a driver that
    starts meanwhile keeps its claim. (Storage without a compare-and-delete leaves a window
    of one read.) None (``--force``): whatever lease and claims are there are removed.

    A lease that cannot be read as one (garbage, a FIFO, a device, a symbolic link loop, a
    link to what is no lease) is judged as none and removed, with or without ``--force``:
    no driver holds a run through it (a driver takes it over, too). A link is removed
    itself, never what it points at. A directory in the lease's place is refused with
    :class:`RunLeaseError`, nothing removed: no driver writes one, and what it holds may
    be someone's. A lease this process may not read raises the storage error (an access
    problem to fix, never a lease to judge as gone).
    """
    location = run.join(LEASE_NAME)
    try:
        previous = read_lease_settled(location, retry)
    except ManifestError:
        previous = None
    if judged is not None and previous is not None and previous != judged.lease:
        raise LeaseChangedError(run, previous)
    if is_dir(location, retry) and not is_local_link(location):
        raise RunLeaseError(
            f"{location.display()} is a directory, not a lease a driver wrote (a driver "
            "writes a file there), and `cairn lease break` removes no directory, so nothing "
            "was removed. Move it away or remove it once you know what it holds, then break "
            "the lease again.")
    try:
        # A link is removed itself, never what it points at (a loop, a file elsewhere).
        delete_file(location, retry)
    except FileNotFoundError:
        pass
    for generation, name in sorted(claim_names(run, retry).items()):
        if judged is None or generation <= judged.generation:
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

    def _read_settled(self) -> LeaseInfo | None:
        """The lease as :func:`read_lease_settled` gives it: a torn read (of the lease this
        driver or another one is rewriting) is read again, so a live lease never looks
        malformed; one that stays malformed raises :class:`ManifestError`."""
        return read_lease_settled(self._location, self._retry)

    def _write(self) -> None:
        info = LeaseInfo(socket.gethostname(), os.getpid(), self._token, time.time(),
                         self._ttl_s, self._generation, pid_namespace())
        write_bytes_atomic(self._location, info.to_json(), self._retry)

    def _run_text(self) -> str:
        return self._location.display().rsplit("/", 1)[0]

    def acquire(self) -> None:
        """Take the lease or raise :class:`RunLeaseError` naming the holder."""
        try:
            current = self._read_settled()
        except ManifestError as exc:
            logger.warning("Taking over the lease of %s: %s", self._run_text(), exc)
            current = None
        if current is not None and current.token != self._token:
            problem = lease_problem(current)
            if problem is not None:
                logger.warning("Taking over an invalid lease of %s (host %s, pid %d): %s",
                               self._run_text(), shown_host(current.host), current.pid, problem)
            elif is_live(current):
                raise RunLeaseError(
                    f"The run at {self._run_text()} is held by another live driver (host "
                    f"{shown_host(current.host)}, pid {current.pid}). Wait for it to finish, "
                    f"stop it, or give this run another RunConfig.name; "
                    f"{BREAK_HINT.format(run=self._run_text())}."
                )
            else:
                logger.warning("Taking over the lease of a driver that is gone (host %s, "
                               "pid %d, heartbeat %.0fs old)", shown_host(current.host),
                               current.pid, time.time() - current.heartbeat_at)
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
        check = self._read_settled()
        if check is None or check.token != self._token:
            holder = f"host {shown_host(check.host)}, pid {check.pid}" if check else "unknown"
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
            f"driver host {shown_host(current.host)}, pid {current.pid}), so it stopped committing "
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
            current = self._read_settled()
            if current is not None and current.token == self._token:
                delete_file(self._location, self._retry)
                delete_file(self._run.join(f"{CLAIM_PREFIX}{self._generation}"), self._retry)
        except (CairnError, OSError):
            logger.warning("Could not release the run lease", exc_info=True)
