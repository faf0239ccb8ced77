"""The run's own files: segment logs, the lease, the index (no worker processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cairn import ManifestError, RunLeaseError
from cairn._src.checkpoint.index import CheckpointRecord, RunIndex, read_index, write_index
from cairn._src.run.lease import RunLease
from cairn._src.run.segment_log import SegmentLog, read_log
from cairn._src.storage.location import resolve
from cairn._src.storage.retry import RetryPolicy

RETRY = RetryPolicy()


def test_segment_log_rolls_segments_and_reads_back_in_order(tmp_path: Path) -> None:
    directory = resolve(str(tmp_path / "log"))
    log = SegmentLog(directory, RETRY, records_per_segment=3)
    for i in range(7):
        log.append({"i": i})
        if i % 2:
            log.flush()
    log.flush()
    assert sorted(os.listdir(tmp_path / "log")) == [
        "segment_000000.jsonl", "segment_000001.jsonl", "segment_000002.jsonl"]
    assert [r["i"] for r in read_log(directory, RETRY)] == list(range(7))
    # A resumed log starts a new segment and never rewrites the old ones.
    again = SegmentLog(directory, RETRY, records_per_segment=3)
    again.append({"i": 7})
    again.flush()
    assert [r["i"] for r in read_log(directory, RETRY)] == list(range(8))


def test_segment_log_skips_a_torn_line(tmp_path: Path) -> None:
    directory = resolve(str(tmp_path / "log"))
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "segment_000000.jsonl").write_text('{"i": 0}\n{"i": 1')
    assert read_log(directory, RETRY) == [{"i": 0}]


def test_lease_refuses_a_live_holder_and_takes_over_a_dead_one(tmp_path: Path) -> None:
    run = resolve(str(tmp_path))
    first = RunLease(run, RETRY, ttl_s=30)
    first.acquire()
    try:
        child = subprocess.run(
            [sys.executable, "-c",
             "import sys; from cairn._src.run.lease import RunLease;"
             "from cairn._src.storage.location import resolve;"
             "from cairn._src.storage.retry import RetryPolicy;"
             f"RunLease(resolve({str(tmp_path)!r}), RetryPolicy()).acquire()"],
            capture_output=True, text=True, check=False)
        assert child.returncode != 0
        assert "is held by another live driver" in child.stderr
    finally:
        first.release()
    assert not (tmp_path / "lease.json").exists()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    (tmp_path / "lease.json").write_text(json.dumps({
        "version": 1, "host": os.uname().nodename, "pid": int(dead.stdout), "token": "x",
        "heartbeat_at": 0, "ttl_s": 30}))
    second = RunLease(run, RETRY)
    second.acquire()
    second.release()


def test_index_round_trip_and_bad_versions(tmp_path: Path) -> None:
    run = resolve(str(tmp_path))
    assert read_index(run, RETRY) is None
    index = RunIndex(checkpoints=(CheckpointRecord(dir_name="a", report_index=3,
                                                   metrics={"x": 1}),), attempts=2)
    write_index(run, index, RETRY)
    loaded = read_index(run, RETRY)
    assert loaded is not None and loaded.latest == index.latest and loaded.attempts == 2
    (tmp_path / "cairn_run.json").write_text('{"version": 9, "checkpoints": []}')
    with pytest.raises(ManifestError, match=r"has version 9; this Cairn reads version 1"):
        read_index(run, RETRY)
    (tmp_path / "cairn_run.json").write_text("{oops")
    with pytest.raises(ManifestError, match=r"is not valid JSON"):
        read_index(run, RETRY)


def test_a_second_fit_in_the_same_process_is_refused(tmp_path: Path) -> None:
    run = resolve(str(tmp_path))
    first = RunLease(run, RETRY)
    first.acquire()
    try:
        with pytest.raises(RunLeaseError, match=r"is held by another live driver"):
            RunLease(run, RETRY).acquire()
    finally:
        first.release()


def test_index_record_target_path_round_trips_and_is_validated() -> None:
    from cairn._src.errors import UnsafePathError

    record = CheckpointRecord(dir_name="ref", report_index=2, target_path="/data/ref",
                              managed=False)
    index = RunIndex(checkpoints=(record,))
    again = RunIndex.from_json(index.to_json(), where="test")
    assert again.checkpoints[0].target_path == "/data/ref"
    old = CheckpointRecord.from_json({"dir_name": "a", "report_index": 1})
    assert old.target_path is None
    with pytest.raises(UnsafePathError, match=r"CheckpointRecord\.target_path='data' is not"):
        CheckpointRecord(dir_name="x", report_index=1, target_path="data")
