"""What every ``cairn`` subcommand shares: the retry budget, opening a run, the refusal of
a run that a live driver holds (and the lease a command that changes a run holds), and
escaping what storage says before a terminal shows it."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from cairn._src.checkpoint.index import RunIndex, read_index
from cairn._src.errors import CairnError, ManifestError, RunLeaseError
from cairn._src.run.layout import LEASE_NAME
from cairn._src.run.lease import LeaseInfo, RunLease, is_live, read_lease_settled
from cairn._src.storage.location import StorageLocation, resolve
from cairn._src.storage.retry import RetryPolicy
from cairn._src.text import printable

RETRY = RetryPolicy()


def open_run(path: str) -> tuple[StorageLocation, RunIndex]:
    run = resolve(path)
    index = read_index(run, RETRY)
    if index is None:
        raise CairnError(f"{run.display()} is not a Cairn run directory (no run index).")
    return run, index


def read_lease(run: StorageLocation) -> LeaseInfo | None:
    """The run's lease as a driver wrote it; None when there is none or it is invalid.

    A read that does not parse is read again, as a driver's own reads are: on a store
    without atomic reads it may be torn by a driver rewriting its lease, and a live lease
    must not look absent. One that stays malformed is invalid (None)."""
    try:
        return read_lease_settled(run.join(LEASE_NAME), RETRY)
    except ManifestError:
        return None


def live_lease(run: StorageLocation) -> LeaseInfo | None:
    # An invalid lease holds nothing: a driver takes it over too.
    lease = read_lease(run)
    return lease if lease is not None and is_live(lease) else None


def heartbeat_age_s(lease: LeaseInfo, *, now: float | None = None) -> float:
    """Seconds since ``lease``'s last heartbeat (0 for one written in the future)."""
    return max(0.0, (time.time() if now is None else now) - lease.heartbeat_at)


def live_run_error(run: StorageLocation, lease: LeaseInfo, advice: str) -> CairnError:
    """The one refusal of every command that must not touch a run a live driver holds
    (``prune``, ``rebuild-index``, ``lease break`` without ``--force``): who holds it, how
    fresh its heartbeat is, and ``advice`` on what to do."""
    return CairnError(
        f"The run at {run.display()} is live: held by host {lease.host}, pid {lease.pid}, "
        f"heartbeat {heartbeat_age_s(lease):.0f} s ago (a lease expires {lease.ttl_s:g} s "
        f"after its last heartbeat when its driver is gone). {advice}")


def refuse_live_run(run: StorageLocation, advice: str) -> None:
    """Raise :func:`live_run_error` when a live driver holds ``run``."""
    lease = live_lease(run)
    if lease is not None:
        raise live_run_error(run, lease, advice)


@contextmanager
def hold_run(run: StorageLocation, advice: str) -> Iterator[Callable[[str], None]]:
    """Hold ``run``'s lease, as a driver does, while a command changes the run (``prune``,
    ``rebuild-index``): a driver started meanwhile is refused with :class:`RunLeaseError`
    instead of having its index written over, and one paused past its ttl is fenced.

    A live driver holding the run: :func:`live_run_error` with ``advice``, nothing
    written. Yields ``fence(done)``, to call right before each change: it raises
    :class:`CairnError` once the lease was taken (``cairn lease break --force`` and a
    driver that started), saying what was ``done`` up to then. The lease is released
    (deleted) when the block ends."""
    lease = RunLease(run, RETRY)
    try:
        lease.acquire()
    except RunLeaseError as exc:
        live = live_lease(run)
        if live is not None:
            raise live_run_error(run, live, advice) from exc
        raise CairnError(f"{exc} {advice}") from exc

    def fence(done: str) -> None:
        try:
            lease.fence()
        except RunLeaseError as exc:
            holder = read_lease(run)
            taken = ("removed (by `cairn lease break --force`, or by hand)" if holder is None
                     else f"taken by host {holder.host}, pid {holder.pid}")
            raise CairnError(f"The lease of the run at {run.display()} that this command "
                             f"held was {taken} while it ran, so it stopped: {done}") from exc

    try:
        yield fence
    finally:
        lease.release()


def format_metrics(metrics: dict[str, Any], limit: int = 60) -> str:
    text = printable(", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                               for k, v in metrics.items()))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float (a diverged loss) as None: strict JSON readers
    (``jq``, JavaScript) refuse ``NaN`` and ``Infinity``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def print_json(document: Any) -> None:
    """Print ``document`` as the strict JSON every ``--json`` writes (see docs/cli.md)."""
    print(json.dumps(json_safe(document), indent=1, allow_nan=False))
