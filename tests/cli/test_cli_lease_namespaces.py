"""``cairn lease break`` without ``--force`` never removes a live driver's lease.

* A lease of this host name from another PID namespace (a container with the host's
  network, a Kubernetes ``hostNetwork`` pod), or one that names no namespace, with a fresh
  heartbeat is live whatever its pid is here: refused, exit 2, the lease stays. One of this
  namespace whose pid is dead is its driver's that is gone: cleared.
* A driver that takes the run over between the judgement and the deletion keeps its lease
  and its claim: exit 2.
* A torn read of a live lease (a store without atomic reads) is read again, not taken for
  no lease.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from cairn._src.cli import common as cli_common
from cairn._src.cli import runs as cli_runs
from cairn._src.cli.common import live_lease, read_lease
from cairn._src.cli.main import main
from cairn._src.run import lease as lease_module
from cairn._src.run.layout import INDEX_NAME, LEASE_NAME
from cairn._src.run.lease import CLAIM_PREFIX, RunLease
from cairn._src.storage.location import resolve
from cairn._src.storage.retry import RetryPolicy

# Above PID_MAX_LIMIT (2**22): no Linux process has this pid.
NO_SUCH_PID = 2**22 + 7


def this_pid_namespace() -> str | None:
    """The ``pid_namespace`` a driver of this process writes into its lease."""
    try:
        stat = os.stat("/proc/self/ns/pid")
        with open("/proc/sys/kernel/random/boot_id") as file:
            return f"{file.read().strip()}/{stat.st_dev}:{stat.st_ino}"
    except OSError:
        return None


HERE = this_pid_namespace()
LIVE = r"error: The run at .* is live: held by host {host}, pid {pid}, heartbeat \d+ s ago"


@pytest.fixture
def run(tmp_path: Path) -> Path:
    # `lease break` reads no index: one that exists makes the directory a run.
    (tmp_path / INDEX_NAME).write_text("{}")
    return tmp_path


def lease_text(**fields: Any) -> str:
    body: dict[str, Any] = {"version": 1, "host": socket.gethostname(), "pid": NO_SUCH_PID,
                            "token": "f" * 32, "heartbeat_at": time.time() - 1,
                            "ttl_s": 30.0, "generation": 1}
    body.update(fields)
    return json.dumps(body)


@pytest.mark.parametrize("namespace", [
    {"pid_namespace": "another-boot/4:4026532000"},  # another container of this host name
    {},  # a lease written before leases named their namespace
    {"pid_namespace": 4026532000},  # the wrong type
])
def test_a_fresh_lease_of_another_pid_namespace_is_not_broken(
        namespace: dict[str, Any], run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = lease_text(**namespace)
    (run / LEASE_NAME).write_text(text)
    assert main(["lease", "break", str(run)]) == 2
    err = capsys.readouterr().err
    assert re.search(LIVE.format(host=re.escape(socket.gethostname()), pid=NO_SUCH_PID), err)
    assert "--force" in err
    assert (run / LEASE_NAME).read_text() == text


@pytest.mark.skipif(HERE is None, reason="no /proc: no pid is judged here")
def test_a_fresh_lease_of_this_pid_namespace_whose_pid_is_dead_is_broken(
        run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (run / LEASE_NAME).write_text(lease_text(pid_namespace=HERE))
    assert main(["lease", "break", str(run)]) == 0
    assert f"was host {socket.gethostname()}, pid {NO_SUCH_PID}" in capsys.readouterr().out
    assert not (run / LEASE_NAME).exists()


def test_a_driver_that_takes_the_run_over_after_the_judgement_keeps_its_lease(
        run: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    (run / LEASE_NAME).write_text(lease_text(heartbeat_at=time.time() - 100, generation=3))
    (run / f"{CLAIM_PREFIX}3").write_bytes(b"")
    real = cli_runs.break_lease
    drivers: list[RunLease] = []

    def a_driver_starts_first(*args: Any, **kwargs: Any) -> Any:
        # The command judged the stale lease breakable; a driver takes the run over now.
        driver = RunLease(resolve(str(run)), RetryPolicy(max_attempts=1))
        driver.acquire()
        drivers.append(driver)
        return real(*args, **kwargs)

    monkeypatch.setattr(cli_runs, "break_lease", a_driver_starts_first)
    try:
        assert main(["lease", "break", str(run)]) == 2
        err = capsys.readouterr().err
        assert re.search(LIVE.format(host=re.escape(socket.gethostname()), pid=os.getpid()),
                         err), err
        held = json.loads((run / LEASE_NAME).read_text())
        assert held["pid"] == os.getpid() and held["generation"] == 4
        assert (run / f"{CLAIM_PREFIX}4").exists()
    finally:
        for driver in drivers:
            driver.release()


def tear_the_first_read(monkeypatch: pytest.MonkeyPatch, text: str) -> list[int]:
    """Wherever the lease is read, the first read returns half of ``text``; the reads
    still torn (``[0]`` once it was)."""
    torn = [1]

    def read_bytes(location: Any, retry: RetryPolicy) -> bytes:
        data = text.encode()
        if torn[0]:
            torn[0] -= 1
            return data[: len(data) // 2]
        return data

    for module in (cli_common, cli_runs, lease_module):
        monkeypatch.setattr(module, "read_bytes", read_bytes, raising=False)
    return torn


def test_a_torn_read_of_a_live_lease_is_read_again(
        run: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    text = lease_text(host="elsewhere", pid=4242)
    (run / LEASE_NAME).write_text(text)
    torn = tear_the_first_read(monkeypatch, text)
    assert main(["lease", "break", str(run)]) == 2
    assert torn == [0]
    assert re.search(LIVE.format(host="elsewhere", pid=4242), capsys.readouterr().err)
    assert (run / LEASE_NAME).read_text() == text


def test_the_commands_read_a_torn_lease_again(
        run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `show`, `prune` and `rebuild-index` judge the run through live_lease: a torn read of
    # a live driver's lease is no run without a driver.
    text = lease_text(host="elsewhere", pid=4242)
    torn = tear_the_first_read(monkeypatch, text)
    live = live_lease(resolve(str(run)))
    assert torn == [0]
    assert live is not None and live.pid == 4242


def test_a_lease_that_stays_malformed_is_no_lease(
        run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_common, "RETRY", RetryPolicy(max_attempts=3,
                                                         initial_backoff_s=0.001))
    (run / LEASE_NAME).write_text(lease_text()[:20])
    assert read_lease(resolve(str(run))) is None
