"""A lease names the PID namespace its pid belongs to, and ``break_lease`` removes only
the lease it was shown.

* The pid of a lease of this host name is judged only when the lease names this process's
  PID namespace: a driver in another one (a container with the host's network, a
  Kubernetes ``hostNetwork`` pod) may be live with a pid this process cannot see. A lease
  that names none (written before the field, or a value of the wrong type) is judged by
  its heartbeat alone.
* ``break_lease(judged=...)`` reads the lease again right before deleting it and refuses
  when another one is there; it deletes no claim above the judged generation.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from cairn._src.errors import RunLeaseError
from cairn._src.run import lease as lease_module
from cairn._src.run.layout import LEASE_NAME
from cairn._src.run.lease import (
    CLAIM_PREFIX,
    LeaseChangedError,
    LeaseInfo,
    RunLease,
    break_lease,
    is_live,
    lease_state,
    pid_namespace,
)
from cairn._src.storage.location import resolve
from cairn._src.storage.retry import RetryPolicy

RETRY = RetryPolicy(max_attempts=1)
NOW = 1_000_000.0
# Above PID_MAX_LIMIT (2**22): no Linux process has this pid.
NO_SUCH_PID = 2**22 + 7
HERE = pid_namespace()
linux_only = pytest.mark.skipif(HERE is None, reason="no /proc: no PID namespace to name")


def lease(**changes: Any) -> LeaseInfo:
    fields: dict[str, Any] = {"host": socket.gethostname(), "pid": NO_SUCH_PID,
                              "token": "t" * 32, "heartbeat_at": NOW - 1, "ttl_s": 30.0,
                              "generation": 1, "pid_namespace": HERE}
    fields.update(changes)
    return LeaseInfo(**fields)


def lease_json(**changes: Any) -> str:
    body: dict[str, Any] = {"version": 1, "host": socket.gethostname(), "pid": NO_SUCH_PID,
                            "token": "f" * 32, "heartbeat_at": time.time() - 1,
                            "ttl_s": 30.0, "generation": 1}
    body.update(changes)
    return json.dumps(body)


@linux_only
def test_the_namespace_names_the_boot_and_the_pid_namespace() -> None:
    assert HERE is not None
    boot, _, namespace = HERE.partition("/")
    with open("/proc/sys/kernel/random/boot_id") as file:
        assert boot == file.read().strip()
    stat = os.stat("/proc/self/ns/pid")
    assert namespace == f"{stat.st_dev}:{stat.st_ino}"


@linux_only
def test_a_dead_pid_settles_a_fresh_lease_only_in_this_pid_namespace() -> None:
    assert not is_live(lease(), now=NOW)
    assert is_live(lease(pid_namespace="another-boot/4:4026532000"), now=NOW)
    assert is_live(lease(pid_namespace=None), now=NOW)
    # The heartbeat still settles a lease of another namespace.
    assert not is_live(lease(pid_namespace="another-boot/4:4026532000",
                             heartbeat_at=NOW - 31), now=NOW)


@pytest.mark.parametrize("value", [12345, ["x"], {"a": 1}, True, "", "x" * 201, None])
def test_a_namespace_of_the_wrong_type_or_none_leaves_a_lease_judged_by_heartbeat(
        value: object) -> None:
    read = LeaseInfo.from_json(lease_json(pid_namespace=value).encode())
    assert read.pid_namespace is None
    assert is_live(read)


def test_a_lease_written_before_the_namespace_field_still_reads() -> None:
    read = LeaseInfo.from_json(lease_json().encode())
    assert read.pid_namespace is None and read.pid == NO_SUCH_PID
    assert is_live(read)  # a fresh heartbeat, a pid that may be in another namespace
    assert LeaseInfo.from_json(lease().to_json()) == lease()


@linux_only
def test_a_driver_records_its_namespace_and_refuses_a_live_lease_of_another(
        tmp_path: Path) -> None:
    run = resolve(str(tmp_path))
    driver = RunLease(run, RETRY)
    driver.acquire()
    try:
        assert json.loads((tmp_path / LEASE_NAME).read_text())["pid_namespace"] == HERE
    finally:
        driver.release()
    for other in ("another-boot/4:4026532000", None):
        (tmp_path / LEASE_NAME).write_text(lease_json(pid_namespace=other))
        with pytest.raises(RunLeaseError, match="held by another live driver"):
            RunLease(run, RETRY).acquire()
        assert json.loads((tmp_path / LEASE_NAME).read_text())["pid"] == NO_SUCH_PID
    # The same namespace and a dead pid: its driver is gone, taken over at once.
    (tmp_path / LEASE_NAME).write_text(lease_json(pid_namespace=HERE))
    second = RunLease(run, RETRY)
    second.acquire()
    second.release()


def test_break_lease_refuses_a_lease_that_changed_since_it_was_judged(
        tmp_path: Path) -> None:
    run = resolve(str(tmp_path))
    (tmp_path / LEASE_NAME).write_text(lease_json(heartbeat_at=time.time() - 100,
                                                  generation=3))
    (tmp_path / f"{CLAIM_PREFIX}3").write_bytes(b"")
    judged = lease_state(run, RETRY)
    assert judged.generation == 3 and judged.lease is not None
    # A driver takes the run over right after the judgement.
    new = lease_json(host="elsewhere", token="a" * 32, generation=4)
    (tmp_path / LEASE_NAME).write_text(new)
    (tmp_path / f"{CLAIM_PREFIX}4").write_bytes(b"")
    with pytest.raises(LeaseChangedError, match=r"changed while `cairn lease break` judged "
                                                r"it .*host elsewhere.*nothing removed"):
        break_lease(run, RETRY, judged=judged)
    assert (tmp_path / LEASE_NAME).read_text() == new
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"{CLAIM_PREFIX}3", f"{CLAIM_PREFIX}4", LEASE_NAME]


def test_break_lease_spares_a_claim_above_the_judged_generation(tmp_path: Path) -> None:
    run = resolve(str(tmp_path))
    (tmp_path / LEASE_NAME).write_text(lease_json(heartbeat_at=time.time() - 100,
                                                  generation=3))
    (tmp_path / f"{CLAIM_PREFIX}2").write_bytes(b"")
    (tmp_path / f"{CLAIM_PREFIX}3").write_bytes(b"")
    judged = lease_state(run, RETRY)
    # A driver has claimed generation 4 and not yet written its lease.
    (tmp_path / f"{CLAIM_PREFIX}4").write_bytes(b"")
    previous = break_lease(run, RETRY, judged=judged)
    assert previous is not None and previous.generation == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{CLAIM_PREFIX}4"]
    # Without a judgement (--force) every claim goes.
    break_lease(run, RETRY)
    assert list(tmp_path.iterdir()) == []


def test_a_planted_last_claim_without_a_lease_is_judged_and_cleared(tmp_path: Path) -> None:
    run = resolve(str(tmp_path))
    (tmp_path / LEASE_NAME).write_text(lease_json(heartbeat_at=time.time() - 100))
    (tmp_path / f"{CLAIM_PREFIX}{10**12 - 1}").write_bytes(b"")
    judged = lease_state(run, RETRY)
    assert judged.generation == 10**12 - 1
    break_lease(run, RETRY, judged=judged)
    assert list(tmp_path.iterdir()) == []


def test_a_driver_reads_a_torn_live_lease_again_instead_of_taking_it_over(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = lease_json(host="elsewhere", pid=4242)
    (tmp_path / LEASE_NAME).write_text(text)
    real = lease_module.read_bytes
    torn = [1]

    def read_bytes(location: Any, retry: RetryPolicy) -> bytes:
        data = real(location, retry)
        if torn[0]:
            torn[0] -= 1
            return data[: len(data) // 2]
        return data

    monkeypatch.setattr(lease_module, "read_bytes", read_bytes)
    with pytest.raises(RunLeaseError, match=r"held by another live driver \(host elsewhere"):
        RunLease(resolve(str(tmp_path)), RETRY).acquire()
    assert torn == [0]
    assert (tmp_path / LEASE_NAME).read_text() == text
