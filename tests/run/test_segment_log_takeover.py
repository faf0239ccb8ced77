"""Two drivers' segment logs over one run, with the lease taken over in between.

A driver whose lease was taken over (it was paused past its ttl and judged dead) may go on
flushing its logs until it next checks the fence. Whatever it writes, it never replaces a
segment the new driver wrote: not when it rolls over to the next segment, not with the
first segment of its session, and not when its write was already under way when the new
driver took over. Real files on local storage, real leases.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cairn import ManifestError, RunLeaseError
from cairn._src.run import segment_log
from cairn._src.run.layout import LEASE_NAME, METRICS_DIR
from cairn._src.run.lease import RunLease
from cairn._src.run.segment_log import SegmentLog, is_segment_name, read_log
from cairn._src.storage.location import StorageLocation, resolve
from cairn._src.storage.retry import RetryPolicy

RETRY = RetryPolicy(max_attempts=1)
# Long enough that no lease renews itself while a test runs: the takeover is the test's.
TTL_S = 600.0


@pytest.fixture
def run(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / METRICS_DIR).mkdir()
    yield tmp_path


def _acquire(run: Path) -> RunLease:
    lease = RunLease(resolve(str(run)), RETRY, ttl_s=TTL_S)
    lease.acquire()
    return lease


def _take_over(run: Path, old: RunLease) -> RunLease:
    """The old driver pauses past its ttl (its heartbeat goes stale) and a new driver takes
    the run over; the old one is fenced from then on, though it does not know it yet."""
    lease_file = run / LEASE_NAME
    held = json.loads(lease_file.read_text())
    held["heartbeat_at"] -= 2 * TTL_S
    lease_file.write_text(json.dumps(held))
    new = _acquire(run)
    with pytest.raises(RunLeaseError, match=r"lost the lease"):
        old.fence()
    return new


def _log(run: Path) -> SegmentLog:
    return SegmentLog(resolve(str(run / METRICS_DIR)), RETRY, records_per_segment=2)


def _write(log: SegmentLog, *labels: str) -> None:
    for label in labels:
        log.append({"report_index": 1, "metrics": {"r": label}})
    log.flush()


def _label(line: str | bytes) -> str:
    label = json.loads(line)["metrics"]["r"]
    assert isinstance(label, str)
    return label


def _read(run: Path) -> list[str]:
    return [record["metrics"]["r"]
            for record in read_log(resolve(str(run / METRICS_DIR)), RETRY)]


def _segments(run: Path) -> dict[str, list[str]]:
    """Each segment's records, by file name (and nothing else is left in the log)."""
    names = sorted(os.listdir(run / METRICS_DIR))
    assert all(is_segment_name(name) for name in names), names
    return {name: [_label(line) for line in (run / METRICS_DIR / name).open()]
            for name in names}


def test_a_fenced_driver_rolling_over_never_replaces_the_new_drivers_segment(
        run: Path) -> None:
    old_lease = _acquire(run)
    old = _log(run)
    _write(old, "old-1", "old-2")  # segment_000000 is full: the next record rolls over
    new_lease = _take_over(run, old_lease)
    try:
        new = _log(run)  # a fresh segment above every existing one: segment_000001
        _write(new, "new-1", "new-2")  # full: never written again
        _write(old, "old-3")  # the fenced driver's rollover
        _write(new, "new-3")
        assert _segments(run)["segment_000001.jsonl"] == ["new-1", "new-2"]
        assert sorted(_read(run)) == ["new-1", "new-2", "new-3", "old-1", "old-2", "old-3"]
    finally:
        old_lease.release()
        new_lease.release()


def test_a_fenced_drivers_first_segment_never_replaces_the_new_drivers_segment(
        run: Path) -> None:
    old_lease = _acquire(run)
    old = _log(run)  # nothing flushed yet: the new driver sees no segment of its session
    new_lease = _take_over(run, old_lease)
    try:
        new = _log(run)
        _write(new, "new-1", "new-2")
        _write(old, "old-1")
        assert _segments(run)["segment_000000.jsonl"] == ["new-1", "new-2"]
        assert sorted(_read(run)) == ["new-1", "new-2", "old-1"]
    finally:
        old_lease.release()
        new_lease.release()


def _stall_first_write(monkeypatch: pytest.MonkeyPatch,
                       during: Callable[[], None]) -> list[str]:
    """Run ``during`` inside the next write of a segment, before its bytes land (a write
    retried through an outage, a process paused mid-flush): the names written, in order."""
    real = segment_log.write_bytes_atomic
    written: list[str] = []

    def write(location: StorageLocation, data: bytes, retry: RetryPolicy, *,
              durable: bool = False) -> None:
        name = location.path.rpartition("/")[2]
        if is_segment_name(name):
            written.append(name)
            if len(written) == 1:
                during()
        real(location, data, retry, durable=durable)

    monkeypatch.setattr(segment_log, "write_bytes_atomic", write)
    return written


@pytest.mark.parametrize("first_write", ["first segment", "rollover"])
def test_a_write_under_way_at_the_takeover_never_replaces_the_new_drivers_segment(
        run: Path, monkeypatch: pytest.MonkeyPatch, first_write: str) -> None:
    old_lease = _acquire(run)
    old = _log(run)
    if first_write == "rollover":
        _write(old, "old-0a", "old-0b")
    leases = [old_lease]

    def take_over_and_write() -> None:
        # The old driver's write has not landed: the new driver cannot see that segment.
        leases.append(_take_over(run, old_lease))
        new = _log(run)
        _write(new, "new-1", "new-2")
        _write(new, "new-3")

    written = _stall_first_write(monkeypatch, take_over_and_write)
    try:
        _write(old, "old-1")  # its write lands after the new driver's
        assert len(written) == 3
        assert len(set(written)) == 3, written
        assert sorted(_read(run)) == sorted(
            ["new-1", "new-2", "new-3", "old-1"]
            + (["old-0a", "old-0b"] if first_write == "rollover" else []))
    finally:
        for lease in leases:
            lease.release()


def test_a_claim_left_by_a_dead_writer_is_skipped_and_never_read(run: Path) -> None:
    metrics = run / METRICS_DIR
    (metrics / "segment_000000.jsonl").write_text(
        '{"report_index": 1, "metrics": {"r": "earlier"}}\n')
    # A driver killed between starting its segment_000001 and writing it.
    (metrics / f"_cairn_claim.segment_000001.jsonl.{'a' * 32}").write_bytes(b"")
    log = _log(run)
    _write(log, "next")
    assert (metrics / "segment_000002.jsonl").exists()
    assert not (metrics / "segment_000001.jsonl").exists()
    assert _read(run) == ["earlier", "next"]
    assert sorted(os.listdir(metrics)) == [
        f"_cairn_claim.segment_000001.jsonl.{'a' * 32}", "segment_000000.jsonl",
        "segment_000002.jsonl"]


def test_a_claim_at_the_last_segment_number_is_a_clear_error(run: Path) -> None:
    # Planted after the log opened (one planted before is refused at the open).
    metrics = run / METRICS_DIR
    log = _log(run)
    planted = f"_cairn_claim.segment_999999999999.jsonl.{'b' * 32}"
    (metrics / planted).write_bytes(b"")
    log.append({"report_index": 1, "metrics": {"r": "kept"}})
    with pytest.raises(ManifestError, match=r"holds _cairn_claim\.segment_999999999999\.jsonl"
                                            r"\.b+, .* Remove it"):
        log.flush()
    assert log.dirty  # nothing lost: the record waits for the next flush
    (metrics / planted).unlink()
    log.flush()
    assert _read(run) == ["kept"]


def test_two_writers_never_share_a_segment_on_any_storage(storage_uri: str) -> None:
    """The same on stores without an exclusive create or a rename (S3 on a real
    S3-protocol server, fsspec's memory store, a plugin store): two writers that opened the
    log at the same segment write their own segments, and every record of both is read."""
    directory = resolve(storage_uri).join(METRICS_DIR)
    old = SegmentLog(directory, RETRY, records_per_segment=2)
    new = SegmentLog(directory, RETRY, records_per_segment=2)  # the same start: nothing yet
    _write(new, "new-1", "new-2")
    _write(old, "old-1", "old-2")
    _write(new, "new-3")
    _write(old, "old-3")
    records = [record["metrics"]["r"] for record in read_log(directory, RETRY)]
    assert records == ["new-1", "new-2", "old-1", "old-2", "new-3", "old-3"]


def test_a_fenced_driver_with_the_leases_fence_starts_no_segment_after_the_takeover(
        run: Path) -> None:
    # As fit() builds its logs: none of the old driver's records can come after the new
    # driver's (readers take the last session's end for the run's status).
    old_lease = _acquire(run)
    old = SegmentLog(resolve(str(run / METRICS_DIR)), RETRY, records_per_segment=2,
                     fence=old_lease.fence)
    _write(old, "old-1", "old-2")
    new_lease = _take_over(run, old_lease)
    try:
        new = SegmentLog(resolve(str(run / METRICS_DIR)), RETRY, records_per_segment=2,
                         fence=new_lease.fence)
        _write(new, "new-1")
        old.append({"report_index": 1, "metrics": {"r": "old-3"}})
        with pytest.raises(RunLeaseError, match=r"lost the lease"):
            old.flush()
        assert _segments(run) == {"segment_000000.jsonl": ["old-1", "old-2"],
                                  "segment_000001.jsonl": ["new-1"]}
    finally:
        old_lease.release()
        new_lease.release()
