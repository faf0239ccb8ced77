"""Which leases are live, which are invalid (pure; no storage)."""

from __future__ import annotations

import os
import socket

import pytest

from cairn._src.errors import ManifestError
from cairn._src.run.lease import MAX_TTL_S, LeaseInfo, is_live, lease_problem, pid_namespace

NOW = 1_000_000.0


def lease(**changes: object) -> LeaseInfo:
    fields: dict[str, object] = {"host": "elsewhere", "pid": 123, "token": "t" * 32,
                                 "heartbeat_at": NOW - 1, "ttl_s": 30.0, "generation": 1}
    fields.update(changes)
    return LeaseInfo(**fields)  # type: ignore[arg-type]


def test_a_fresh_lease_of_another_host_is_live() -> None:
    assert is_live(lease(), now=NOW)


def test_a_heartbeat_older_than_the_ttl_is_gone_whatever_the_pid() -> None:
    assert not is_live(lease(heartbeat_at=NOW - 31), now=NOW)
    # On this host, with a pid that exists (this very process's parent): still gone.
    assert not is_live(lease(host=socket.gethostname(), pid=os.getppid(),
                             heartbeat_at=NOW - 31), now=NOW)


@pytest.mark.parametrize(("changes", "problem"), [
    ({"pid": 0}, "its pid is 0"),
    ({"pid": -1}, "its pid is -1"),
    ({"ttl_s": 0.0}, "its ttl_s is 0 (a lease has 0 < ttl_s <= 3600)"),
    ({"ttl_s": MAX_TTL_S * 10}, "its ttl_s is 36000 (a lease has 0 < ttl_s <= 3600)"),
    ({"heartbeat_at": NOW + 100}, "its heartbeat is 100s in the future, more than its ttl "
                                  "of 30s"),
])
def test_invalid_leases_are_never_live(changes: dict[str, object], problem: str) -> None:
    assert lease_problem(lease(**changes), now=NOW) == problem
    assert not is_live(lease(**changes), now=NOW)


@pytest.mark.skipif(pid_namespace() is None, reason="no /proc: no pid is judged here")
def test_a_pid_past_the_os_range_on_this_host_is_not_a_live_driver() -> None:
    # Read back from storage: a pid no process can have answers "gone", not an error.
    here = {"host": socket.gethostname(), "pid_namespace": pid_namespace()}
    assert not is_live(lease(pid=10**30, **here), now=NOW)
    assert is_live(lease(pid=os.getppid(), **here), now=NOW)


def test_a_heartbeat_slightly_ahead_is_clock_skew_not_an_invalid_lease() -> None:
    assert lease_problem(lease(heartbeat_at=NOW + 5), now=NOW) is None


def test_a_lease_round_trips_and_wrong_types_are_refused() -> None:
    original = lease()
    assert LeaseInfo.from_json(original.to_json()) == original
    with pytest.raises(ManifestError, match=r"pid"):
        LeaseInfo.from_json(b'{"version": 1, "host": "h", "pid": "abc", "token": "t", '
                            b'"heartbeat_at": 1.0, "ttl_s": 30.0}')
