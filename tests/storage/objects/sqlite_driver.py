"""A driver script whose storage is a ``pyarrow.fs.FileSystemHandler`` over SQLite.

Run as ``python sqlite_driver.py DB SCRATCH --mode SYNC|ASYNC|NO_UPLOAD [options]``, so that
``SQLiteHandler`` and the train function live in this script's ``__main__``, as they would
in a user's script ported from Ray Train: ``RunConfig(storage_filesystem=
pyarrow.fs.PyFileSystem(SQLiteHandler(db)), storage_path="bucket/runs")``. Nothing is
registered and nothing is importable by the workers: the handler reaches them pickled.

Workers leave notes in SCRATCH (``resumed_<attempt>_<rank>``, ``committed_<attempt>_<step>``)
for the tests. Prints a JSON summary as its last line.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sqlite3
import tempfile
import threading
import time
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

import cairn
from cairn import Checkpoint, CheckpointUploadMode

RUNS = "bucket/runs"
REFS = "bucket/refs"  # NO_UPLOAD checkpoints: on the run's filesystem, outside the run


def _range(prefix: str) -> tuple[str, str]:
    """Keys strictly below directory ``prefix``: from 'prefix/' up to 'prefix0'."""
    return f"{prefix}/", f"{prefix}0"


class _Writer(io.RawIOBase):
    def __init__(self, handler: SQLiteHandler, key: str) -> None:
        super().__init__()
        self._handler, self._key, self._buffer = handler, key, io.BytesIO()

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        return self._buffer.write(data)

    def close(self) -> None:
        if not self.closed:
            self._handler._put(self._key, self._buffer.getvalue())
        super().close()


class SQLiteHandler(pafs.FileSystemHandler):
    """Files as rows of one SQLite table; directories implicit (and explicit when made).

    Pickles as the database path; every process and thread opens its own connection.
    Two handlers on one database are equal, so their filesystems are ``equals()``.
    """

    def __init__(self, db: str) -> None:
        self.db = db
        self._local = threading.local()

    def __getstate__(self) -> dict[str, Any]:
        return {"db": self.db}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["db"])  # type: ignore[misc]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SQLiteHandler) and other.db == self.db

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(self.db)

    def _db(self) -> sqlite3.Connection:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = sqlite3.connect(self.db, timeout=60, isolation_level=None)
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("CREATE TABLE IF NOT EXISTS files "
                               "(path TEXT PRIMARY KEY, data BLOB NOT NULL)")
            connection.execute("CREATE TABLE IF NOT EXISTS dirs (path TEXT PRIMARY KEY)")
            self._local.connection = connection
        return connection

    def _put(self, key: str, data: bytes) -> None:
        self._db().execute("INSERT OR REPLACE INTO files VALUES (?, ?)", (key, data))

    def _get(self, key: str) -> bytes:
        row = self._db().execute("SELECT data FROM files WHERE path = ?", (key,)).fetchone()
        if row is None:
            raise FileNotFoundError(f"{key!r} does not exist")
        return bytes(row[0])

    def _is_dir(self, key: str) -> bool:
        if not key:
            return True
        low, high = _range(key)
        db = self._db()
        return bool(
            db.execute("SELECT 1 FROM dirs WHERE path = ?", (key,)).fetchone()
            or db.execute("SELECT 1 FROM files WHERE path >= ? AND path < ? LIMIT 1",
                          (low, high)).fetchone()
            or db.execute("SELECT 1 FROM dirs WHERE path >= ? AND path < ? LIMIT 1",
                          (low, high)).fetchone())

    def get_type_name(self) -> str:
        return "sqlite"

    def normalize_path(self, path: str) -> str:
        return path.strip("/")

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        infos = []
        for path in paths:
            key = path.strip("/")
            row = self._db().execute("SELECT length(data) FROM files WHERE path = ?",
                                     (key,)).fetchone() if key else None
            if row is not None:
                infos.append(pafs.FileInfo(path, pafs.FileType.File, size=int(row[0])))
            elif self._is_dir(key):
                infos.append(pafs.FileInfo(path, pafs.FileType.Directory))
            else:
                infos.append(pafs.FileInfo(path, pafs.FileType.NotFound))
        return infos

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        base = selector.base_dir.strip("/")
        if base and not self._is_dir(base):
            if self._db().execute("SELECT 1 FROM files WHERE path = ?", (base,)).fetchone():
                raise NotADirectoryError(f"{base!r} is a file")
            if selector.allow_not_found:
                return []
            raise FileNotFoundError(f"{base!r} does not exist")
        prefix = f"{base}/" if base else ""
        low, high = _range(base) if base else ("", "\U0010ffff")
        db = self._db()
        files = db.execute("SELECT path, length(data) FROM files WHERE path >= ? AND path < ?",
                           (low, high)).fetchall()
        dirs = db.execute("SELECT path FROM dirs WHERE path >= ? AND path < ?",
                          (low, high)).fetchall()
        infos: dict[str, pafs.FileInfo] = {}
        for key, size in [*files, *((d, None) for (d,) in dirs)]:
            parts = key[len(prefix):].split("/")
            for depth in range(1, len(parts)):
                if depth > 1 and not selector.recursive:
                    break
                name = prefix + "/".join(parts[:depth])
                infos.setdefault(name, pafs.FileInfo(name, pafs.FileType.Directory))
            if selector.recursive or len(parts) == 1:
                kind = pafs.FileType.Directory if size is None else pafs.FileType.File
                infos[key] = pafs.FileInfo(key, kind, size=size)
        return [infos[name] for name in sorted(infos)]

    def create_dir(self, path: str, recursive: bool) -> None:
        parts = path.strip("/").split("/")
        for depth in range(1, len(parts) + 1):
            self._db().execute("INSERT OR IGNORE INTO dirs VALUES (?)",
                               ("/".join(parts[:depth]),))

    def _delete_below(self, key: str) -> None:
        low, high = _range(key) if key else ("", "\U0010ffff")
        db = self._db()
        db.execute("DELETE FROM files WHERE path >= ? AND path < ?", (low, high))
        db.execute("DELETE FROM dirs WHERE path >= ? AND path < ?", (low, high))

    def delete_dir(self, path: str) -> None:
        key = path.strip("/")
        self._delete_below(key)
        self._db().execute("DELETE FROM dirs WHERE path = ?", (key,))

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self._delete_below(path.strip("/"))

    def delete_root_dir_contents(self) -> None:
        self._delete_below("")

    def delete_file(self, path: str) -> None:
        key = path.strip("/")
        if self._db().execute("DELETE FROM files WHERE path = ?", (key,)).rowcount == 0:
            raise FileNotFoundError(f"{key!r} does not exist")

    def move(self, src: str, dest: str) -> None:
        data = self._get(src.strip("/"))
        self._put(dest.strip("/"), data)
        self._db().execute("DELETE FROM files WHERE path = ?", (src.strip("/"),))

    def copy_file(self, src: str, dest: str) -> None:
        self._put(dest.strip("/"), self._get(src.strip("/")))

    def open_input_stream(self, path: str) -> pa.NativeFile:
        return pa.BufferReader(self._get(path.strip("/")))

    def open_input_file(self, path: str) -> pa.NativeFile:
        return pa.BufferReader(self._get(path.strip("/")))

    def open_output_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        return pa.PythonFile(_Writer(self, path.strip("/")), mode="w")

    def open_append_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        raise NotImplementedError("appends are not supported")


def _note(scratch: str, name: str, body: dict[str, Any]) -> None:
    tmp = os.path.join(scratch, f".{name}.tmp")
    with open(tmp, "w") as f:
        json.dump(body, f)
    os.replace(tmp, os.path.join(scratch, name))


def train(config: dict[str, Any]) -> None:
    context = cairn.get_context()
    rank, attempt = context.get_world_rank(), context.get_attempt()
    mode = CheckpointUploadMode(config["mode"])
    start = 0
    resumed = cairn.get_checkpoint()
    if resumed is not None:
        with resumed.as_directory() as d, open(os.path.join(d, "state.json")) as f:
            start = json.load(f)["step"] + 1
        _note(config["scratch"], f"resumed_{attempt}_{rank}",
              {"start": start, "path": resumed.path})
    # Rank 0 writes references through a handler of its own (equal to the run's), rank 1
    # through the run's filesystem object as get_storage() gives it.
    own = pafs.PyFileSystem(SQLiteHandler(config["db"]))
    run_fs = context.get_storage().storage_filesystem
    for step in range(start, config["steps"]):
        if attempt == 0 and rank == 1 and step == config["crash_at"]:
            os._exit(1)
        state = {"step": step, "rank": rank}
        files = {f"rank_{rank}.json": json.dumps(state).encode()}
        if rank == 0:
            files["state.json"] = json.dumps(state).encode()
        metrics = {"step": step, "loss": 1.0 / (step + 1)}
        if mode is CheckpointUploadMode.NO_UPLOAD:
            fs = own if rank == 0 else run_fs
            target = f"{REFS}/{config['name']}/step_{step:04d}"
            fs.create_dir(target)
            for name, data in files.items():
                with fs.open_output_stream(f"{target}/{name}") as out:
                    out.write(data)
            handle = cairn.report(metrics, Checkpoint(target, filesystem=fs),
                                  checkpoint_upload_mode=mode)
            handle.wait()  # a NO_UPLOAD report returns before its commit
        else:
            directory = tempfile.mkdtemp()
            for name, data in files.items():
                with open(os.path.join(directory, name), "wb") as f:
                    f.write(data)
            cairn.report(metrics, Checkpoint.from_directory(directory),
                         checkpoint_upload_mode=mode)
        if mode is not CheckpointUploadMode.ASYNC and rank == 0:
            _note(config["scratch"], f"committed_{attempt}_{step}", {})
        time.sleep(config["step_s"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("db")
    parser.add_argument("scratch")
    parser.add_argument("--mode", choices=["SYNC", "ASYNC", "NO_UPLOAD"], required=True)
    parser.add_argument("--name", default="run")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--step-s", type=float, default=0.0)
    parser.add_argument("--crash-at", type=int, default=-1)
    args = parser.parse_args()
    filesystem = pafs.PyFileSystem(SQLiteHandler(args.db))
    config = {"mode": args.mode, "db": args.db, "scratch": args.scratch, "name": args.name,
              "steps": args.steps, "step_s": args.step_s, "crash_at": args.crash_at}
    result = cairn.Trainer(
        train,
        train_loop_config=config,
        scaling_config=cairn.ScalingConfig(num_workers=2),
        run_config=cairn.RunConfig(
            name=args.name, storage_path=RUNS, storage_filesystem=filesystem,
            checkpoint_config=cairn.CheckpointConfig(num_to_keep=2),
            failure_config=cairn.FailureConfig(max_failures=2)),
    ).fit()
    assert result.checkpoint is not None
    result.checkpoint.verify()
    with result.checkpoint.as_directory() as d:
        names = sorted(os.listdir(d))
        with open(os.path.join(d, "state.json")) as f:
            state = json.load(f)
    print(json.dumps({"metrics": result.metrics, "attempts": result.goodput.attempts,
                      "checkpoint": result.checkpoint.path, "files": names, "state": state,
                      "kept": sorted(c.path for c, _ in result.best_checkpoints)}))


if __name__ == "__main__":
    main()
