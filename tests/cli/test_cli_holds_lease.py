"""``prune`` and ``rebuild-index`` hold the run's lease for the whole command.

A one-time look at the lease before reading is not enough: ``prune`` reads the whole
event log (seconds on S3) and then writes an index computed from what it read at the
start. A driver that starts meanwhile (a supervisor restarting the training script) is
refused with :class:`RunLeaseError` instead of having its index rolled back and its
checkpoint directories deleted; a driver paused past its ttl is fenced; a command whose
lease is taken (``cairn lease break --force`` and a driver that started) stops before its
next change.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cli_workloads
import pytest

import cairn
from cairn._src.cli import runs as cli_runs
from cairn._src.cli.common import RETRY
from cairn._src.cli.main import main
from cairn._src.errors import RunLeaseError
from cairn._src.run.layout import INDEX_NAME, LEASE_NAME
from cairn._src.run.lease import RunLease, break_lease
from cairn._src.storage.location import resolve


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    storage = tmp_path_factory.mktemp("held") / "storage"
    cairn.Trainer(cli_workloads.train, train_loop_config={"steps": 3},
                  run_config=cairn.RunConfig(name="run", storage_path=str(storage))).fit()
    return storage / "run"


@pytest.fixture
def run(pristine: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(pristine, copy)
    return copy


def checkpoints(run: Path) -> list[str]:
    return sorted(n for n in os.listdir(run) if n.startswith("checkpoint_"))


def lease_files(run: Path) -> list[str]:
    return sorted(n for n in os.listdir(run) if n == LEASE_NAME or n.startswith("_cairn_lease"))


def driver_starting_before(call: Callable[..., Any], run: Path,
                           drivers: list[RunLease]) -> Callable[..., Any]:
    """``call``, after a driver took (or tried to take) ``run``'s lease; the drivers that
    got it go to ``drivers``."""
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        driver = RunLease(resolve(str(run)), RETRY)
        driver.acquire()
        drivers.append(driver)
        return call(*args, **kwargs)

    return wrapped


def test_prune_refuses_a_driver_that_starts_while_it_reads_the_event_log(
        run: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    before = (run / INDEX_NAME).read_bytes()
    names = checkpoints(run)
    drivers: list[RunLease] = []
    # fit() of a restarted training script takes the lease (and would then write the
    # index: attempts + 1) while prune reads the event log.
    monkeypatch.setattr(cli_runs, "read_log",
                        driver_starting_before(cli_runs.read_log, run, drivers))
    try:
        assert main(["prune", str(run), "--keep", "1"]) == 2
    finally:
        for driver in drivers:
            driver.release()
    err = capsys.readouterr().err
    assert not drivers  # the driver was refused: it never held the run
    assert f"cairn prune: error: The run at {run} is held by another live driver (host " in err
    assert f"pid {os.getpid()})" in err
    assert (run / INDEX_NAME).read_bytes() == before
    assert checkpoints(run) == names
    assert lease_files(run) == []  # prune released its lease


def test_prune_holds_the_lease_while_it_runs_and_releases_it(
        run: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    read_log = cli_runs.read_log
    seen: list[dict[str, Any]] = []

    def look_at_the_lease(*args: Any, **kwargs: Any) -> Any:
        seen.append(json.loads((run / LEASE_NAME).read_text()))
        return read_log(*args, **kwargs)

    monkeypatch.setattr(cli_runs, "read_log", look_at_the_lease)
    assert main(["prune", str(run), "--keep", "1"]) == 0
    assert [lease["pid"] for lease in seen] == [os.getpid()]
    assert checkpoints(run) == ["checkpoint_000003"]
    assert lease_files(run) == []
    # A dry run changes nothing and takes no lease: it only looks.
    seen.clear()
    (run / LEASE_NAME).write_text("{}")
    monkeypatch.setattr(cli_runs, "read_log", read_log)
    assert main(["prune", str(run), "--keep", "1", "--dry-run"]) == 0
    assert (run / LEASE_NAME).read_text() == "{}"


def test_prune_stops_before_writing_when_its_lease_is_taken(
        run: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    before = (run / INDEX_NAME).read_bytes()
    names = checkpoints(run)
    read_log = cli_runs.read_log
    drivers: list[RunLease] = []

    def lease_broken_and_a_driver_starts(*args: Any, **kwargs: Any) -> Any:
        # `cairn lease break --force`, then a driver starts and takes the run.
        location = resolve(str(run))
        break_lease(location, RETRY)
        driver = RunLease(location, RETRY)
        driver.acquire()
        drivers.append(driver)
        return read_log(*args, **kwargs)

    monkeypatch.setattr(cli_runs, "read_log", lease_broken_and_a_driver_starts)
    try:
        assert main(["prune", str(run), "--keep", "1", "--json"]) == 2
        out = capsys.readouterr().out
        error = json.loads(out)["error"]
        assert error.startswith(f"The lease of the run at {run} that this command held was "
                                f"taken by host ")
        assert error.endswith(f"pid {os.getpid()} while it ran, so it stopped: nothing "
                              "changed.")
        assert (run / INDEX_NAME).read_bytes() == before
        assert checkpoints(run) == names
        # The driver's lease stays: prune releases only its own.
        assert json.loads((run / LEASE_NAME).read_text())["generation"] == \
            drivers[0].generation
        drivers[0].fence()
    finally:
        for driver in drivers:
            driver.release()


def test_a_driver_paused_past_its_ttl_is_fenced_by_prune(
        run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paused = RunLease(resolve(str(run)), RETRY, ttl_s=0.3)
    paused.acquire()
    try:
        # The driver's process is paused (SIGSTOP, a debugger, swap): no renewal.
        paused._stop.set()
        assert paused._thread is not None
        paused._thread.join()
        time.sleep(0.4)  # past its ttl: it looks gone
        assert main(["prune", str(run), "--keep", "1"]) == 0
        assert checkpoints(run) == ["checkpoint_000003"]
        # Resumed, it must not write its index (which still lists the pruned
        # checkpoints) over prune's.
        with pytest.raises(RunLeaseError, match="was removed while it ran"):
            paused.fence()
    finally:
        paused.release()


def test_rebuild_index_refuses_a_driver_that_starts_while_it_reads_the_manifests(
        run: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    before = (run / INDEX_NAME).read_bytes()
    drivers: list[RunLease] = []
    monkeypatch.setattr(cli_runs, "rebuild_index",
                        driver_starting_before(cli_runs.rebuild_index, run, drivers))
    try:
        assert main(["rebuild-index", str(run)]) == 2
    finally:
        for driver in drivers:
            driver.release()
    assert not drivers
    assert "is held by another live driver" in capsys.readouterr().err
    assert (run / INDEX_NAME).read_bytes() == before
    assert lease_files(run) == []


def test_lease_break_refuses_a_run_that_prune_holds(
        run: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    read_log = cli_runs.read_log
    codes: list[int] = []

    def lease_break_meanwhile(*args: Any, **kwargs: Any) -> Any:
        codes.append(main(["lease", "break", str(run)]))
        return read_log(*args, **kwargs)

    monkeypatch.setattr(cli_runs, "read_log", lease_break_meanwhile)
    assert main(["prune", str(run), "--keep", "1"]) == 0
    assert codes == [2]
    assert f"is live: held by host {socket.gethostname()}" in capsys.readouterr().err
    assert checkpoints(run) == ["checkpoint_000003"]
