"""Driver restarts on the xyz store: kill -9 of a driver process, then a rerun continues.

The rerun is a fresh process that registers nothing in code: it reaches the store through
the ``xyz`` entry point and the URIs recorded in the run, nothing else.
"""

from __future__ import annotations

import os
import signal
import subprocess
import urllib.parse
from pathlib import Path

import pytest
from xyz_support import finish, start_driver, wait_for
from xyz_workloads import read_note, store_uri

import cairn

xyzstorage = pytest.importorskip("xyzstorage", reason="pip install -e examples/xyzstorage")


def _kill(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait()


def test_own_checkpoints_resume_after_the_driver_is_killed(tmp_path: Path, scratch: str) -> None:
    db = str(tmp_path / "xyz.db")
    storage = str(tmp_path / "runs")  # the run's index and manifests; the data is in xyz
    args = ("--store", "xyz", "--mode", "NO_UPLOAD", "--db", db)
    driver = start_driver(storage, scratch, *args)
    wait_for(lambda: os.path.exists(os.path.join(scratch, "committed_0_2")), driver)
    _kill(driver)

    summary = finish(start_driver(storage, scratch, *args, "--step-s", "0"))
    assert summary["registered_in_code"] == []  # xyz came from the entry point
    assert summary["attempts"] == 2
    assert summary["metrics"] == {"step": 7, "loss": 0.125}
    job = {"store": "xyz", "db": db}
    assert summary["checkpoint"] == store_uri(job, "ckpts/run/step_0007")
    resumed = [read_note(scratch, f"resumed_1_{rank}") for rank in (0, 1)]
    assert resumed[0] == resumed[1]
    # Never behind step 2, whose commit rank 0 saw before the kill.
    start = resumed[0]["start"]
    assert start >= 3
    assert resumed[0]["uri"] == store_uri(job, f"ckpts/run/step_{start - 1:04d}")
    result = cairn.Result.from_path(os.path.join(storage, "run"))
    for checkpoint, _ in result.best_checkpoints:
        checkpoint.verify()


def test_run_in_the_store_continues_after_the_driver_is_killed(
    tmp_path: Path, scratch: str
) -> None:
    db = str(tmp_path / "xyz.db")
    storage = f"xyz://runs?db={urllib.parse.quote(db, safe='/')}"
    args = ("--store", "xyz", "--mode", "SYNC", "--db", db)
    driver = start_driver(storage, scratch, *args)
    wait_for(lambda: os.path.exists(os.path.join(scratch, "committed_0_2")), driver)
    _kill(driver)
    client = xyzstorage.connect(db)
    assert client.size("runs/run/lease.json") is not None  # the dead driver's lease

    summary = finish(start_driver(storage, scratch, *args, "--step-s", "0"))
    assert summary["registered_in_code"] == []
    assert summary["attempts"] == 2
    assert summary["metrics"] == {"step": 7, "loss": 0.125}
    start = read_note(scratch, "resumed_1_0")["start"]
    assert start >= 3
    result = cairn.Result.from_path(f"xyz://runs/run?db={db}")
    assert result.checkpoint is not None and result.checkpoint.uri == summary["checkpoint"]
    frame = result.metrics_dataframe
    first, second = frame[frame["attempt"] == 0], frame[frame["attempt"] == 1]
    assert second["report_index"].min() > first["report_index"].max()
    committed = {c.uri.split("?")[0].rsplit("/", 1)[1] for c, _ in result.best_checkpoints
                 if c.uri is not None}
    for checkpoint, _ in result.best_checkpoints:
        checkpoint.verify()
    # Nothing partial from the killed driver's attempt is left in the store.
    top = {key.split("/")[2] for key, _ in client.scan("runs/run/")}
    assert {name for name in top if name.startswith("checkpoint_")} == committed
