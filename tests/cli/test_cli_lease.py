"""``cairn lease break`` and the commands that refuse a live run (issue 25, item 2).

* ``prune``, ``rebuild-index`` and ``lease break`` refuse a run whose lease is live with
  one wording: host, pid and the heartbeat's age in seconds;
* ``lease break --force`` removes a live lease, and the driver that held it (a real run)
  fails with an error that says the lease was removed and nobody holds the run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import cli_workloads
import pytest

import cairn
from cairn import RunLeaseError
from cairn._src.cli.main import main
from cairn._src.run.layout import INDEX_NAME, LEASE_NAME


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    storage = tmp_path_factory.mktemp("lease") / "storage"
    cairn.Trainer(cli_workloads.train, train_loop_config={"steps": 2},
                  run_config=cairn.RunConfig(name="run", storage_path=str(storage))).fit()
    return storage / "run"


@pytest.fixture
def run(pristine: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(pristine, copy)
    return copy


def write_lease(run: Path, **fields: Any) -> None:
    lease: dict[str, Any] = {"version": 1, "host": "elsewhere", "pid": 4242, "token": "f" * 32,
                             "heartbeat_at": time.time() - 5, "ttl_s": 30.0, "generation": 1}
    lease.update(fields)
    (run / LEASE_NAME).write_text(json.dumps(lease))


LIVE = r"The run at .* is live: held by host elsewhere, pid 4242, heartbeat \d+ s ago"


@pytest.mark.parametrize(("command", "advice"), [
    (["prune", "RUN", "--keep", "1"], "Prune it when the run has stopped; nothing changed"),
    (["rebuild-index", "RUN"], "Rebuild its index when the run has stopped; nothing written"),
    (["lease", "break", "RUN"], r"`cairn lease break --force .*` removes it anyway"),
])
def test_every_command_refuses_a_live_run_alike(
        command: list[str], advice: str, run: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    write_lease(run)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    assert main([str(run) if arg == "RUN" else arg for arg in command]) == 2
    err = capsys.readouterr().err
    assert re.search(f"error: {LIVE}.*{advice}", err), err
    assert not re.search(r"\d{9,}", err)  # an age, not an epoch time
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


def test_lease_break_clears_a_lease_that_is_not_live(
        run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_lease(run, heartbeat_at=time.time() - 100)  # older than its ttl: its driver is gone
    assert main(["lease", "break", str(run)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"was host elsewhere, pid 4242, heartbeat 1\d\d s ago\)", out), out
    assert not (run / LEASE_NAME).exists()


def test_lease_break_force_says_what_it_does_to_a_live_driver(
        run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["lease", "break", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--force remove the lease even though its heartbeat is fresh: a driver still " \
        "running the run finds its lease gone" in help_text
    assert "stops committing checkpoints and fails with RunLeaseError" in help_text
    write_lease(run)
    assert main(["lease", "break", str(run), "--force", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["previous"]["pid"] == 4242
    assert not (run / LEASE_NAME).exists()


def _committed(run: Path, name: str) -> bool:
    try:
        index = json.loads((run / INDEX_NAME).read_text())
    except (FileNotFoundError, ValueError):
        return False
    return name in [c.get("dir_name") for c in index.get("checkpoints", [])]


def test_a_driver_whose_lease_was_broken_by_force_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    storage = tmp_path / "storage"
    run = storage / "run"
    codes: dict[str, int] = {}
    stop = threading.Event()

    def break_it() -> None:
        while not _committed(run, "checkpoint_000002"):
            if stop.wait(0.01):
                return
        codes["plain"] = main(["lease", "break", str(run)])
        codes["force"] = main(["lease", "break", str(run), "--force"])

    breaker = threading.Thread(target=break_it, daemon=True)
    breaker.start()
    try:
        with pytest.raises(RunLeaseError, match=(
                r"This driver's lease of the run at .* was removed while it ran \(by `cairn "
                r"lease break --force`, or by hand\) and no driver holds the run now, so this "
                r"driver stopped committing checkpoints")) as lost:
            cairn.Trainer(cli_workloads.checkpoint_until_lease_gone,
                          train_loop_config={"lease": str(run / LEASE_NAME)},
                          run_config=cairn.RunConfig(name="run",
                                                     storage_path=str(storage))).fit()
    finally:
        stop.set()
        breaker.join()
    assert "new holder" not in str(lost.value)
    assert codes == {"plain": 2, "force": 0}
    err = capsys.readouterr().err
    assert re.search(rf"is live: held by host .*, pid {os.getpid()}, heartbeat \d+ s ago", err)
    assert not _committed(run, "checkpoint_000003")
    # As the message says, fit() again continues the run.
    result = cairn.Trainer(cli_workloads.train, train_loop_config={"steps": 1},
                           run_config=cairn.RunConfig(name="run",
                                                      storage_path=str(storage))).fit()
    assert result.checkpoint is not None
    assert len(json.loads((run / INDEX_NAME).read_text())["checkpoints"]) == 3
