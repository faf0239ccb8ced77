"""Storage given as an object, as Ray Train accepts it: a ``FileSystemHandler`` over SQLite.

The handler class is defined in the driver script (``sqlite_driver.py``, run as
``python sqlite_driver.py``), so it lives in ``__main__`` and reaches the workers pickled.
Real worker processes, a real ``os._exit`` and a real ``kill -9`` of the driver.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

from driver_process import finish, start_script, wait_for

DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sqlite_driver.py")


def _run(db: str, scratch: str, *args: str) -> dict[str, object]:
    return finish(start_script(DRIVER, db, scratch, *args))


def _rows(db: str, prefix: str) -> list[str]:
    with sqlite3.connect(db) as connection:
        return sorted(path for (path,) in connection.execute(
            "SELECT path FROM files WHERE path LIKE ?", (prefix + "%",)))


def _index(db: str, run: str = "run") -> dict[str, object]:
    with sqlite3.connect(db) as connection:
        (data,) = connection.execute("SELECT data FROM files WHERE path = ?",
                                     (f"bucket/runs/{run}/cairn_run.json",)).fetchone()
    document: dict[str, object] = json.loads(data)
    return document


def test_sync_uploads_survive_a_worker_exit(tmp_path: Path, scratch: str) -> None:
    db = str(tmp_path / "store.db")
    summary = _run(db, scratch, "--mode", "SYNC", "--crash-at", "3")
    assert summary["attempts"] == 2
    assert summary["state"] == {"step": 5, "rank": 0}
    assert summary["files"] == ["rank_0.json", "rank_1.json", "state.json"]
    resumed = json.loads((Path(scratch) / "resumed_1_0").read_text())
    assert resumed["start"] == 3  # from step 2, the last checkpoint before the exit
    # Everything lives in the database: nothing of the run on the local disk.
    assert any(p.endswith("/_cairn_manifest.json") for p in _rows(db, "bucket/runs/run/"))
    assert not (Path.cwd() / "bucket").exists()


def test_async_uploads(tmp_path: Path, scratch: str) -> None:
    db = str(tmp_path / "store.db")
    summary = _run(db, scratch, "--mode", "ASYNC")
    assert summary["attempts"] == 1
    assert summary["state"] == {"step": 5, "rank": 0}
    assert str(summary["checkpoint"]).startswith("bucket/runs/run/checkpoint_")
    assert len(summary["kept"]) == 2  # type: ignore[arg-type]


def test_references_outside_the_run_resume_after_a_worker_exit(
    tmp_path: Path, scratch: str
) -> None:
    db = str(tmp_path / "store.db")
    summary = _run(db, scratch, "--mode", "NO_UPLOAD", "--crash-at", "3")
    assert summary["attempts"] == 2
    assert summary["checkpoint"] == "bucket/refs/run/step_0005"
    resumed = [json.loads((Path(scratch) / f"resumed_1_{r}").read_text()) for r in (0, 1)]
    assert resumed[0] == resumed[1]
    assert resumed[0]["path"].startswith("bucket/refs/run/step_")
    # Recorded as a path on the run's filesystem: it has no URI.
    records = _index(db)["checkpoints"]
    assert isinstance(records, list) and records
    for record in records:
        assert record["target_uri"] is None
        assert record["target_path"].startswith("/bucket/refs/run/step_")
        assert record["managed"] is False


def test_rerun_after_a_driver_kill_resumes_from_the_reference(
    tmp_path: Path, scratch: str
) -> None:
    db = str(tmp_path / "store.db")
    args = ("--mode", "NO_UPLOAD", "--steps", "8")
    driver = start_script(DRIVER, db, scratch, *args, "--step-s", "0.3")
    wait_for(lambda: os.path.exists(os.path.join(scratch, "committed_0_2")), driver)
    driver.send_signal(signal.SIGKILL)
    driver.wait()

    summary = finish(start_script(DRIVER, db, scratch, *args))
    assert summary["attempts"] == 2
    assert summary["checkpoint"] == "bucket/refs/run/step_0007"
    start = json.loads((Path(scratch) / "resumed_1_0").read_text())
    assert start["start"] >= 3  # never behind step 2, which rank 0 saw committed
    assert start["path"] == f"bucket/refs/run/step_{start['start'] - 1:04d}"


def test_an_unpicklable_handler_is_refused_at_fit(tmp_path: Path) -> None:
    script = tmp_path / "unpicklable.py"
    script.write_text(
        "import sqlite3, pyarrow.fs as pafs, cairn\n"
        "class Handler(pafs.FSSpecHandler):\n"
        "    def __init__(self):\n"
        "        import fsspec\n"
        "        super().__init__(fsspec.filesystem('file'))\n"
        "        self.connection = sqlite3.connect(':memory:')\n"
        "def train():\n"
        "    pass\n"
        "try:\n"
        "    cairn.Trainer(train, run_config=cairn.RunConfig(name='r', storage_path='/x',\n"
        "        storage_filesystem=pafs.PyFileSystem(Handler()))).fit()\n"
        "except cairn.ConfigError as exc:\n"
        "    print('ERROR', exc)\n"
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert "ERROR RunConfig.storage_filesystem=" in out
    assert "cannot be pickled with cloudpickle (TypeError: cannot pickle 'sqlite3.Connection'" \
        in out
    assert "zero-argument factory" in out and "register_scheme" in out
