"""Committed means durable (contract item 4 on local storage): the run is killed with
kill -9 right after a commit returns, the page cache of its files is evicted, and both
checkpoints read back whole; the fsyncs that make this hold after a power loss too are
checked in their order: every data file, then its directories, before the manifest is
written; the manifest and the index each fsynced under a temporary name, renamed, and
their directory fsynced. ``RunConfig(storage_fsync=False)`` makes none of them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import durable_workloads
import torch

import cairn
from cairn._src.checkpoint.manifest import MANIFEST_NAME
from cairn._src.run.layout import INDEX_NAME

SCRIPT = os.path.join(os.path.dirname(__file__), "durable_script.py")
TEMPORARY = ".cairn-tmp-"


def run_killed(storage: Path, scratch: str, *extra: str) -> None:
    driver = subprocess.run([sys.executable, SCRIPT, str(storage), scratch, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300,
                            check=False)
    assert driver.returncode == -9, driver.stdout.decode()[-5000:]


def evict_page_cache(root: Path) -> None:
    """Drop the cached pages of every file under ``root`` (clean ones: what was written
    back), so that reading them again reads the disk, as a fresh mount would."""
    for path in root.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def fsyncs(scratch: str) -> list[tuple[int, int, str]]:
    """Every fsync of the driver and the workers: (start, end, path), by start."""
    calls = []
    for log in Path(scratch).glob("fsync_*.jsonl"):
        calls += [tuple(json.loads(line)) for line in log.read_text().splitlines()]
    return sorted(calls)  # type: ignore[arg-type]


def check_read_back(run: Path) -> None:
    result = cairn.Result.from_path(str(run))
    assert [c.path.rsplit("/", 1)[-1] for c, _ in result.best_checkpoints] == [
        "checkpoint_000001", "checkpoint_000002", "checkpoint_000003"]
    first, second, third = (c for c, _ in result.best_checkpoints)
    for checkpoint in (first, second, third):
        checkpoint.verify()
    with third.as_directory() as directory:
        assert Path(directory, "by_fn", "fn.bin").read_bytes() == \
            durable_workloads.expected_bytes(9)
    with first.as_directory() as directory:
        for rank in (0, 1):
            path = Path(directory, "nested", "deep", f"rank_{rank}.bin")
            assert path.read_bytes() == durable_workloads.expected_bytes(rank)
        assert Path(directory, "top.bin").read_bytes() == b"top" * 1000
    with second.as_directory() as directory:
        for rank in (0, 1):
            state = torch.load(os.path.join(directory, f"rank_{rank}", "state.pt"))
            assert torch.equal(state["w"], durable_workloads.expected_tensor(rank))


def test_killed_right_after_commit_reads_back_whole_and_fsyncs_in_order(
    tmp_path: Path, scratch: str
) -> None:
    storage = tmp_path / "storage"
    run_killed(storage, scratch)
    run = storage / "run"
    evict_page_cache(run)
    check_read_back(run)

    calls = fsyncs(scratch)
    index_data = [start for start, _, path in calls
                  if path.startswith(str(run / INDEX_NAME) + TEMPORARY)]
    for name in ("checkpoint_000001", "checkpoint_000002", "checkpoint_000003"):
        directory = run / name
        manifest = json.loads((directory / MANIFEST_NAME).read_text())
        # The manifest's data under its temporary name, then the rename (the directory).
        manifest_data = [(start, end) for start, end, path in calls
                         if path.startswith(str(directory / MANIFEST_NAME) + TEMPORARY)]
        assert len(manifest_data) == 1, calls
        manifest_start, manifest_end = manifest_data[0]
        assert any(path == str(directory) and start > manifest_end
                   for start, _, path in calls), calls
        # Every data file and every directory that holds it, up to the run's, before.
        for rel in manifest["files"]:
            parts = rel.split("/")
            holders = [directory.joinpath(*parts[:cut]) for cut in range(len(parts))]
            for path in [directory.joinpath(*parts), *holders, run]:
                assert any(end < manifest_start for _, end, synced in calls
                           if synced == str(path)), (path, calls)
        # The index naming the checkpoint comes after its manifest.
        assert any(start > manifest_end for start in index_data), calls
    index_renamed = [start for start, _, path in calls if path == str(run)]
    assert index_renamed and max(index_renamed) > max(index_data)
    # The directories the run created (storage/ and storage/run/): each entry in its
    # parent.
    synced = [path for _, _, path in calls]
    assert str(storage) in synced and str(storage.parent) in synced, calls
    # The event log and the metrics history are flushed durably too (a validation's
    # request is flushed before its checkpoint exists, and must outlive it).
    for log in ("events", "metrics"):
        assert any(path.startswith(str(run / log) + os.sep) and TEMPORARY in path
                   for _, _, path in calls), (log, calls)
        assert str(run / log) in [path for _, _, path in calls], (log, calls)


def test_storage_fsync_false_makes_no_fsync(tmp_path: Path, scratch: str) -> None:
    storage = tmp_path / "storage"
    run_killed(storage, scratch, "--no-fsync")
    # A killed process loses nothing the kernel holds: the checkpoints are whole.
    check_read_back(storage / "run")
    assert fsyncs(scratch) == []
