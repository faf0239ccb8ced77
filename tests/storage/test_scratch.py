"""Restore directories in a RAM file system: named after their process, and removed once
that process is gone, and nothing else removed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import cairn
from cairn._src.storage import scratch


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def named(base: Path, pid: int, namespace: str | None = None) -> Path:
    return base / f"{scratch.PREFIX}{namespace or scratch._namespace()}-{pid}-abc"


def test_a_directory_is_named_after_its_process_and_private(tmp_path: Path) -> None:
    directory = Path(scratch.make_directory(str(tmp_path)))
    assert directory.parent == tmp_path
    assert directory.name.startswith(
        f"{scratch.PREFIX}{scratch._namespace()}-{os.getpid()}-")
    assert directory.stat().st_mode & 0o777 == 0o700


def test_only_directories_of_processes_that_are_gone_are_removed(tmp_path: Path) -> None:
    gone = dead_pid()
    stale = named(tmp_path, gone)
    (stale / "sub").mkdir(parents=True)
    (stale / "sub" / "model.pt").write_bytes(b"x" * 100)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    (stale / "link").symlink_to(outside)  # removed as a link, never followed
    alive = named(tmp_path, os.getppid())
    alive.mkdir()
    mine = named(tmp_path, os.getpid())
    mine.mkdir()
    other_namespace = named(tmp_path, gone, namespace="999999")
    other_namespace.mkdir()
    link = named(tmp_path, dead_pid())
    link.symlink_to(outside)
    a_file = named(tmp_path, dead_pid())
    a_file.write_text("not a directory")
    unrelated = tmp_path / f"cairn-checkpoint-{gone}-xyz"  # no namespace: not ours
    unrelated.mkdir()
    # A pid no process can have (past the OS's range, or 0): gone, not an error.
    impossible = [named(tmp_path, pid) for pid in (10**30, 0)]
    for directory in impossible:
        directory.mkdir()

    assert sorted(scratch.sweep_stale(str(tmp_path))) == sorted(
        [stale.name, *(d.name for d in impossible)])
    assert not stale.exists() and not any(d.exists() for d in impossible)
    for kept in (alive, mine, other_namespace, unrelated, outside / "keep.txt"):
        assert kept.exists(), kept
    assert link.is_symlink() and a_file.is_file()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory away")
def test_a_directory_of_another_user_is_left_alone(tmp_path: Path) -> None:
    theirs = named(tmp_path, dead_pid())
    theirs.mkdir()
    os.chown(theirs, 12345, 12345)
    assert scratch.sweep_stale(str(tmp_path)) == []
    assert theirs.exists()


def test_a_base_that_cannot_be_listed_removes_nothing(tmp_path: Path) -> None:
    assert scratch.sweep_stale(str(tmp_path / "missing")) == []


@pytest.mark.skipif(not os.access("/dev/shm", os.W_OK), reason="no writable /dev/shm")
def test_a_run_on_the_local_backend_removes_what_killed_workers_left_in_ram(
        tmp_path: Path) -> None:
    # A replacement killed during its peer transfer left its directory of received files
    # in /dev/shm: the run's end removes it (not some later run's restore).
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    stale = Path(scratch.SHARED_MEMORY,
                 f"{scratch.PREFIX}{scratch._namespace()}-{process.pid}-killed")
    (stale / "sub").mkdir(parents=True)
    (stale / "sub" / "model.pt").write_bytes(b"x" * 4096)
    try:
        cairn.Trainer(_nothing, scaling_config=cairn.ScalingConfig(num_workers=1),
                      run_config=cairn.RunConfig(name="r", storage_path=str(tmp_path),
                                                 progress=0)).fit()
        assert not stale.exists()
    finally:
        shutil.rmtree(stale, ignore_errors=True)


def _nothing() -> None:
    pass


def test_a_deferred_reports_directory_left_by_a_killed_process_is_swept(
        tmp_path: Path) -> None:
    # A worker killed (kill -9) while it writes a snapshot into its deferred directory can
    # never remove it: it is named after its process, and swept once that process is gone.
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    code = ("import os, signal\n"
            "from cairn._src.worker.upload_job import deferred_directory\n"
            "path = deferred_directory()\n"
            "os.mkdir(path, 0o700)\n"
            "open(os.path.join(path, 'model.pt'), 'wb').write(b'x' * 100)\n"
            "print(path, flush=True)\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    process = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, check=False)
    assert process.returncode == -9, process.stderr
    left = Path(process.stdout.strip())
    assert left.parent == tmp_path and (left / "model.pt").exists()
    assert scratch.sweep_stale(str(tmp_path)) == [left.name]
    assert not left.exists()
