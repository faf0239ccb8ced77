"""``RunConfig(storage_filesystem=...)`` as Ray Train accepts it, with real worker processes:
a pyarrow filesystem, an fsspec filesystem, an ObjectStore and a zero-argument factory; and
the refusals, each with a message that recommends only routes that work."""

from __future__ import annotations

import json
import os
import pickle
import threading
from pathlib import Path
from typing import Any

import fsspec
import pyarrow.fs as pafs
import pytest

import cairn
from cairn._src.storage.location import resolve
from cairn._src.storage.object_store import ObjectInfo


def _steps(config: dict[str, Any]) -> None:
    ckpt = cairn.get_checkpoint()
    start = 0
    if ckpt is not None:
        with ckpt.as_directory() as d, open(os.path.join(d, "s.json")) as f:
            start = json.load(f)["step"] + 1
    for step in range(start, config["steps"]):
        directory = os.path.join(config["scratch"], f"w{cairn.get_context().get_world_rank()}"
                                 f"_{cairn.get_context().get_attempt()}_{step}")
        os.makedirs(directory)
        if cairn.get_context().get_world_rank() == 0:
            with open(os.path.join(directory, "s.json"), "w") as f:
                json.dump({"step": step}, f)
        cairn.report({"step": step}, cairn.Checkpoint.from_directory(directory))


class _FileStore:
    """An ObjectStore over a local directory (one file per key): picklable, shared by
    every process, as a user's store client would be."""

    def __init__(self, root: str) -> None:
        self.root = root

    def _path(self, key: str) -> str:
        return os.path.join(self.root, key.replace("/", "%2F"))

    def open_read(self, key: str) -> Any:
        return open(self._path(key), "rb")

    def write(self, key: str, stream: Any) -> None:
        tmp = self._path(key) + f".tmp{os.getpid()}.{threading.get_ident()}"
        with open(tmp, "wb") as f:
            f.write(stream.read())
        os.replace(tmp, self._path(key))

    def list(self, prefix: str) -> list[ObjectInfo]:
        out = []
        for name in os.listdir(self.root):
            key = name.replace("%2F", "/")
            if ".tmp" not in name and key.startswith(prefix):
                out.append(ObjectInfo(key, os.path.getsize(os.path.join(self.root, name))))
        return out

    def delete(self, key: str) -> None:
        try:
            os.remove(self._path(key))
        except FileNotFoundError:
            pass

    def stat(self, key: str) -> ObjectInfo | None:
        try:
            return ObjectInfo(key, os.path.getsize(self._path(key)))
        except FileNotFoundError:
            return None


def _fit(storage_path: str, filesystem: object, scratch: str, steps: int = 3) -> cairn.Result:
    return cairn.Trainer(
        _steps, train_loop_config={"steps": steps, "scratch": scratch},
        scaling_config=cairn.ScalingConfig(num_workers=2),
        run_config=cairn.RunConfig(name="run", storage_path=storage_path,
                                   storage_filesystem=filesystem),
    ).fit()


def _subtree(root: str) -> pafs.FileSystem:
    return pafs.SubTreeFileSystem(root, pafs.LocalFileSystem())


@pytest.mark.parametrize("kind", ["pyarrow", "fsspec", "object_store", "factory"])
def test_storage_objects_reach_the_workers_and_a_rerun_continues(
    kind: str, tmp_path: Path, scratch: str
) -> None:
    root = tmp_path / "store"
    root.mkdir()
    made: dict[str, Any] = {
        "pyarrow": lambda: _subtree(str(root)),
        "fsspec": lambda: fsspec.filesystem("dir", path=str(root),
                                            fs=fsspec.filesystem("file")),
        "object_store": lambda: _FileStore(str(root)),
        "factory": lambda: (lambda: _subtree(str(root))),
    }
    first = _fit("bucket/runs", made[kind](), scratch)
    assert first.metrics["step"] == 2
    # The same script again, with an equal (new) filesystem object: the run continues.
    second = _fit("bucket/runs", made[kind](), scratch, steps=5)
    assert second.metrics["step"] == 4
    assert second.goodput.attempts == 2
    assert second.checkpoint is not None
    with second.checkpoint.as_directory() as d, open(os.path.join(d, "s.json")) as f:
        assert json.load(f) == {"step": 4}
    # Report numbering continued: 3 reports, then 2 more.
    assert second.metrics_dataframe["report_index"].tolist() == [1, 2, 3, 4, 5]


def test_in_process_stores_are_refused_with_routes_that_work(tmp_path: Path) -> None:
    routes = (r"Use a local directory \(storage_path='/tmp/runs', or tempfile.mkdtemp\(\) in "
              r"tests\), a remote URI such as 's3://bucket/runs'")
    with pytest.raises(cairn.ConfigError, match=r"RunConfig\(storage_path='memory://runs'\) "
                                                r"is an in-process store: every worker "
                                                r"process .*" + routes):
        _fit("memory://runs", None, str(tmp_path))
    with pytest.raises(cairn.ConfigError, match=r"RunConfig\(storage_filesystem=<fsspec.*"
                                                r"MemoryFileSystem.*is an in-process store.*"
                                                + routes):
        _fit("runs", fsspec.filesystem("memory"), str(tmp_path))
    for message in ("zero-argument factory", "cannot reach"):
        with pytest.raises(cairn.ConfigError) as info:
            _fit("runs", fsspec.filesystem("memory"), str(tmp_path))
        assert message not in str(info.value)


def test_locations_from_objects_keep_one_store_identity_across_pickling(tmp_path: Path) -> None:
    fs = _subtree(str(tmp_path))
    run = resolve("runs/run", fs)
    copy = pickle.loads(pickle.dumps(run.join("ckpt")))
    # In the process that made it, a store unpickles as its own object.
    assert copy.filesystem is run.filesystem
    assert resolve("elsewhere", fs).same_store(run)
    assert run.same_store(copy) and run.contains(copy) and not copy.contains(run)
    assert copy == run.join("ckpt")
    other = resolve("runs/run", pafs.PyFileSystem(pafs.FSSpecHandler(
        fsspec.filesystem("memory"))))
    assert not run.same_store(other)


class _Handler(pafs.FSSpecHandler):  # type: ignore[misc]
    """A handler with no __eq__: only identity tells two of its filesystems apart."""

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)


def test_the_runs_filesystem_object_passed_again_is_the_runs_store(tmp_path: Path) -> None:
    import subprocess
    import sys

    fs = pafs.PyFileSystem(_Handler(fsspec.filesystem("dir", path=str(tmp_path),
                                                      fs=fsspec.filesystem("file"))))
    run = resolve("runs/run", fs)
    assert run.uri is None
    # What a worker receives, and what it builds from get_storage().storage_filesystem.
    script = (
        "import pickle, sys\n"
        "from cairn._src.storage.location import resolve\n"
        "run = pickle.loads(sys.stdin.buffer.read())\n"
        "ref = resolve(run.path.rsplit('/', 1)[0] + '/refs/x', run.filesystem)\n"
        "other = resolve(run.path, pickle.loads(pickle.dumps(run.filesystem)))\n"
        "sys.stdout.buffer.write(pickle.dumps((run, ref, other)))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.abspath(__file__))}
    done = subprocess.run([sys.executable, "-c", script], input=pickle.dumps(run),
                          capture_output=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    out = done.stdout
    back, ref, other = pickle.loads(out)
    assert back.filesystem is run.filesystem and ref.filesystem is run.filesystem
    assert run.same_store(ref)
    assert not run.same_store(other)  # another handler object without __eq__: not the same


def test_a_subtree_rooted_at_the_disk_root_keeps_every_file_at_its_absolute_path(
    tmp_path: Path, scratch: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # SubTreeFileSystem("/") has relative paths whose OS paths are absolute: the lease,
    # the index and the checkpoints land under tmp_path, never under the working directory.
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    storage = str(tmp_path / "store").lstrip("/")
    first = _fit(storage, _subtree("/"), scratch)
    assert first.metrics["step"] == 2
    second = _fit(storage, _subtree("/"), scratch, steps=4)
    assert second.metrics["step"] == 3
    assert (tmp_path / "store" / "run" / "cairn_run.json").is_file()
    assert list(elsewhere.iterdir()) == []
