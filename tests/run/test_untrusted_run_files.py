"""The run's own files read back as untrusted input: names no storage can hold, logs of
many bad records, records too large for one segment, a planted storage marker, a lease
whose host name holds control characters."""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

import cairn
from cairn import ConfigError, ManifestError, RunLeaseError
from cairn._src.checkpoint.index import read_index
from cairn._src.run import schema, segment_log, storage_check
from cairn._src.run.layout import INDEX_NAME, LEASE_NAME, is_stored_dir_name
from cairn._src.run.lease import RunLease
from cairn._src.run.segment_log import SegmentLog, read_log
from cairn._src.storage.location import resolve
from cairn._src.storage.retry import RetryPolicy

RETRY = RetryPolicy()
# A name JSON can spell ("\udc80") that has no UTF-8 form: no storage can name it.
LONE_SURROGATE = "checkpoint_\udc80"


def test_a_stored_dir_name_with_a_lone_surrogate_is_refused() -> None:
    assert not is_stored_dir_name(LONE_SURROGATE)
    assert schema.check_value(LONE_SURROGATE, schema.DIR_NAME) is not None
    assert is_stored_dir_name("checkpoint_é")


def _train(config: dict[str, Any]) -> None:
    del config
    resumed = cairn.get_checkpoint() is not None
    directory = Path(tempfile.mkdtemp())
    (directory / "weights.bin").write_bytes(b"w" * 16)
    cairn.report({"resumed": resumed}, checkpoint=cairn.Checkpoint.from_directory(str(directory)))


def test_an_index_naming_a_checkpoint_no_storage_can_hold_is_rebuilt(tmp_path: Path) -> None:
    config = cairn.RunConfig(name="run", storage_path=str(tmp_path))
    local = cairn.ScalingConfig(num_workers=0)
    cairn.Trainer(_train, scaling_config=local, run_config=config).fit()
    index_path = tmp_path / "run" / INDEX_NAME
    body = json.loads(index_path.read_text())
    body["checkpoints"][0]["dir_name"] = LONE_SURROGATE
    index_path.write_text(json.dumps(body))  # ensure_ascii: the JSON spells "\udc80"
    with pytest.raises(ManifestError, match="dir_name"):
        read_index(resolve(str(tmp_path / "run")), RETRY)
    # A malformed index is rebuilt from the manifests: the run resumes, no UnicodeEncodeError.
    result = cairn.Trainer(_train, scaling_config=local, run_config=config).fit()
    assert result.error is None
    assert result.metrics["resumed"] is True


def _write_segment(directory: Path, data: bytes) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "segment_000000.jsonl").write_bytes(data)


def test_a_log_of_many_bad_records_is_read_without_keeping_a_message_for_each(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    lines = 50_000
    data = b"{}\n" * lines  # valid JSON, never a valid event record
    _write_segment(tmp_path / "events", data)
    real_read = segment_log.read_bytes

    def read_then_reset_peak(*args: Any, **kwargs: Any) -> bytes:
        # The peak of the parse alone: the reader's own read buffer is not in question.
        read = real_read(*args, **kwargs)
        tracemalloc.reset_peak()
        return read

    monkeypatch.setattr(segment_log, "read_bytes", read_then_reset_peak)
    tracemalloc.start()
    try:
        with caplog.at_level(logging.WARNING, logger="cairn._src.run.segment_log"):
            records = read_log(resolve(str(tmp_path / "events")), RETRY)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert records == []
    assert f"Skipped {lines} unreadable or invalid records" in caplog.text
    assert "line 1 is invalid" in caplog.text
    # A message kept per skipped record (hundreds of bytes each): about 100 times the data.
    assert peak < 8 * len(data)


def test_lines_split_as_before_and_number_as_before(tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    good = b'{"report_index":1,"metrics":{}}'
    _write_segment(tmp_path / "metrics", good + b"\r" + b"bad\r\n" + good + b"\n\n" + good)
    with caplog.at_level(logging.WARNING, logger="cairn._src.run.segment_log"):
        assert len(read_log(resolve(str(tmp_path / "metrics")), RETRY)) == 3
    assert "segment_000000.jsonl line 2 is not valid JSON" in caplog.text


def test_large_records_roll_the_segment_before_a_reader_would_refuse_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Scaled down: a reader that takes segments of at most 4 KiB, and a log whose segments
    # stay within that (the real sizes: 256 MiB read, 16 MiB written).
    limit = 4096
    real_read = segment_log.read_bytes
    monkeypatch.setattr(segment_log, "read_bytes",
                        lambda location, retry, **_: real_read(location, retry, limit=limit))
    monkeypatch.setattr(segment_log, "MAX_SEGMENT_BYTES", limit, raising=False)
    directory = resolve(str(tmp_path / "metrics"))
    log = SegmentLog(directory, RETRY)
    histogram = list(range(250))  # about 1 KiB of JSON a record
    for index in range(1, 13):
        log.append({"report_index": index, "metrics": {"histogram": histogram}})
        if index % 5 == 0:
            log.flush()
    log.flush()
    sizes = [path.stat().st_size for path in sorted((tmp_path / "metrics").iterdir())]
    assert len(sizes) > 1 and max(sizes) <= limit
    assert [r["report_index"] for r in read_log(directory, RETRY)] == list(range(1, 13))
    # One record larger than a segment gets a segment of its own; the others still read.
    log.append({"report_index": 13, "metrics": {"histogram": list(range(2000))}})
    log.append({"report_index": 14, "metrics": {}})
    log.flush()
    assert [r["report_index"] for r in read_log(directory, RETRY)] == [
        *range(1, 13), 14]


def test_records_per_segment_still_rolls_small_records(tmp_path: Path) -> None:
    directory = resolve(str(tmp_path / "log"))
    log = SegmentLog(directory, RETRY, records_per_segment=3)
    for i in range(7):
        log.append({"i": i})
    log.flush()
    assert len(list((tmp_path / "log").iterdir())) == 3
    assert [r["i"] for r in read_log(directory, RETRY)] == list(range(7))


def test_a_storage_marker_nested_too_deeply_is_a_config_error_not_a_recursion_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage_check, "_RECHECK_DELAYS_S", ())
    (tmp_path / storage_check.MARKER_NAME).write_bytes(b"[" * 2000 + b"]" * 2000)
    with pytest.raises(ConfigError, match="it is not the JSON the driver wrote"):
        storage_check.check_storage_marker(resolve(str(tmp_path)), "0" * 32, RETRY)


def _planted_lease(host: str, *, heartbeat_at: float) -> str:
    return json.dumps({"version": 1, "host": host, "pid": 4242, "token": "f" * 32,
                       "heartbeat_at": heartbeat_at, "ttl_s": 30.0, "generation": 1})


def test_a_lease_host_with_control_characters_never_reaches_a_message_raw(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    host = "evil\n2030-01-01 ERROR forged line\x1b[2K" + "x" * 500
    (tmp_path / LEASE_NAME).write_text(_planted_lease(host, heartbeat_at=time.time()))
    run = resolve(str(tmp_path))
    with pytest.raises(RunLeaseError) as refused:
        RunLease(run, RETRY).acquire()
    message = str(refused.value)
    assert "host evil\\n2030-01-01 ERROR forged line\\x1b[2K" in message
    assert "\n" not in message and "\x1b" not in message and "x" * 200 not in message
    # A lease whose driver is gone is taken over, with a warning naming its host.
    (tmp_path / LEASE_NAME).write_text(_planted_lease(host, heartbeat_at=time.time() - 100))
    with caplog.at_level(logging.WARNING, logger="cairn._src.run.lease"):
        lease = RunLease(run, RETRY)
        lease.acquire()
        lease.release()
    warning = caplog.records[0].getMessage()
    assert "(host evil\\n2030" in warning and "\n" not in warning and "\x1b" not in warning


def test_a_segment_of_more_records_than_any_writer_makes_is_read_in_part(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Each record kept costs far more than its bytes: the reader stops at the cap.
    record = b'{"report_index":1,"metrics":{}}\n'
    _write_segment(tmp_path / "metrics", record * (segment_log.MAX_SEGMENT_RECORDS + 5))
    with caplog.at_level(logging.WARNING, logger="cairn._src.run.segment_log"):
        records = read_log(resolve(str(tmp_path / "metrics")), RETRY)
    assert len(records) == segment_log.MAX_SEGMENT_RECORDS
    assert (f"segment_000000.jsonl holds more than {segment_log.MAX_SEGMENT_RECORDS} "
            "records, which no segment Cairn writes does") in caplog.text
    with pytest.raises(ConfigError, match=r"records_per_segment=10001 must be from 1 to 10000"):
        SegmentLog(resolve(str(tmp_path / "metrics")), RETRY,
                               records_per_segment=10_001)


def test_a_log_directory_that_is_a_link_is_neither_read_nor_written(tmp_path: Path) -> None:
    # It points at another run's log: its records are not this run's, nor is it this
    # run's to write to.
    other = tmp_path / "other" / "events"
    _write_segment(other, b'{"type":"session_start","t":1.0}\n')
    run = tmp_path / "run"
    run.mkdir()
    (run / "events").symlink_to(other)
    before = sorted(os.listdir(other))
    for action in (lambda: read_log(resolve(str(run / "events")), RETRY),
                   lambda: SegmentLog(resolve(str(run / "events")), RETRY)):
        with pytest.raises(ManifestError, match=r"events is a symbolic link: not a directory "
                                                r"this run wrote"):
            action()
    assert sorted(os.listdir(other)) == before


def test_a_planted_claim_of_the_last_segment_number_is_refused_when_the_log_opens(
        tmp_path: Path) -> None:
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / f"_cairn_claim.segment_999999999999.jsonl.{'a' * 32}").touch()
    with pytest.raises(ManifestError, match=r"holds segment_999999999999\.jsonl or a "
                                            r"writer's claim of it"):
        SegmentLog(resolve(str(tmp_path / "metrics")), RETRY)
