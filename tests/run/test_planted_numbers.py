"""Numbers planted in the run's files: storage is untrusted input.

* A number field (a time, a ttl) holding an int beyond a double's range (``10**400`` is
  valid JSON) is a schema error naming the file, the field and the value shortened, never a
  raw ``OverflowError`` from a ``float()`` deep inside Cairn; a count (bytes, a size) holding
  more than a 64-bit integer is too.
* A file name whose number is absurdly long (``segment_<199 ones>.jsonl``,
  ``_cairn_lease.<243 digits>``) or spelt with other scripts' digits is not one Cairn wrote:
  it is ignored, so the next segment and the next lease claim keep names the file system
  takes.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from cairn import ManifestError, RunLeaseError
from cairn._src.checkpoint.index import RunIndex
from cairn._src.goodput.summary import summarize
from cairn._src.run import schema
from cairn._src.run.events import PreemptionNotice, as_events, parse_event, read_events
from cairn._src.run.layout import LEASE_NAME
from cairn._src.run.lease import CLAIM_PREFIX, LeaseInfo, RunLease, break_lease, claim_names
from cairn._src.run.segment_log import SegmentLog, read_log
from cairn._src.storage.location import resolve
from cairn._src.storage.retry import RetryPolicy

RETRY = RetryPolicy(max_attempts=1)
HUGE = 10**400  # valid JSON, under Python's 4300-digit limit; float() of it overflows
# The smallest int that float() rounds to infinity.
FLOAT_OVERFLOW = 2**1024 - 2**970


def lease_bytes(**fields: Any) -> bytes:
    lease: dict[str, Any] = {"version": 1, "host": "elsewhere", "pid": 4242,
                             "token": "f" * 32, "heartbeat_at": 1.0, "ttl_s": 30.0,
                             "generation": 1}
    lease.update(fields)
    return json.dumps(lease).encode()


# --- bug A: numbers beyond a double ---------------------------------------------------------


def test_a_number_field_refuses_an_int_beyond_a_double() -> None:
    assert schema.TIME.check(FLOAT_OVERFLOW - 1) == FLOAT_OVERFLOW - 1
    assert schema.TIME.check(-(FLOAT_OVERFLOW - 1)) == -(FLOAT_OVERFLOW - 1)
    assert schema.TIME.check(1e300) == 1e300
    for value in (FLOAT_OVERFLOW, -FLOAT_OVERFLOW, HUGE, -HUGE):
        problem = schema.check_value(value, schema.TIME)
        assert problem is not None and "expected a finite number" in problem
        assert "1.8e+308" in problem
    problem = schema.check_value(HUGE, schema.Number(finite=False))
    assert problem is not None and "1.8e+308" in problem
    # The value is shortened, and says how long it is.
    problem = schema.check_value(HUGE, schema.TIME)
    assert problem is not None and "401 digits" in problem and len(problem) < 200


def test_a_count_refuses_more_than_a_64_bit_integer() -> None:
    assert schema.COUNT.check(2**63 - 1) == 2**63 - 1
    problem = schema.check_value(HUGE, schema.COUNT)
    assert problem is not None and "expected an integer <= 9223372036854775807" in problem


def test_a_lease_with_a_ttl_beyond_a_double_is_a_schema_error() -> None:
    with pytest.raises(ManifestError) as caught:
        LeaseInfo.from_json(lease_bytes(ttl_s=HUGE), where="/runs/r/lease.json")
    message = str(caught.value)
    assert message.startswith("The lease /runs/r/lease.json is invalid: field 'ttl_s' is "
                              "1000000000")
    assert "401 digits" in message and "expected a finite number" in message
    assert "It is not a lease Cairn wrote." in message
    assert len(message) < 400
    with pytest.raises(ManifestError, match="field 'heartbeat_at'"):
        LeaseInfo.from_json(lease_bytes(heartbeat_at=-HUGE))


def test_a_lease_with_a_ttl_beyond_a_double_is_taken_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / LEASE_NAME).write_bytes(lease_bytes(ttl_s=HUGE))
    lease = RunLease(resolve(str(tmp_path)), RETRY)
    with caplog.at_level(logging.WARNING):
        lease.acquire()
    try:
        assert any("Taking over the lease" in r.getMessage() and "ttl_s" in r.getMessage()
                   for r in caplog.records)
        assert lease.generation == 1
    finally:
        lease.release()


def test_cairn_lease_break_clears_a_lease_with_a_huge_ttl_without_a_traceback(
    tmp_path: Path
) -> None:
    (tmp_path / LEASE_NAME).write_bytes(lease_bytes(ttl_s=HUGE, heartbeat_at=HUGE))
    assert break_lease(resolve(str(tmp_path)), RETRY) is None
    assert not (tmp_path / LEASE_NAME).exists()


def test_the_index_with_a_created_at_beyond_a_double_is_a_schema_error() -> None:
    body = {"version": 1, "checkpoints": [], "created_at": HUGE}
    with pytest.raises(ManifestError) as caught:
        RunIndex.from_json(json.dumps(body).encode(), where="/runs/r/cairn_run.json")
    message = str(caught.value)
    assert "The run index /runs/r/cairn_run.json is invalid: field 'created_at' is" in message
    assert "expected a finite number" in message and "rebuilds it" in message
    record = {"dir_name": "checkpoint_000001", "report_index": 1, "committed_at": HUGE}
    with pytest.raises(ManifestError, match=r"field 'checkpoints\[0\]\.committed_at'"):
        RunIndex.from_json(json.dumps({"version": 1, "checkpoints": [record]}).encode(),
                           where="/runs/r/cairn_run.json")


def test_parse_event_names_a_deadline_beyond_a_double() -> None:
    record = {"type": "preemption_notice", "t": 1, "deadline_t": HUGE}
    with pytest.raises(ManifestError, match=r"field 'deadline_t' is 1000.*401 digits.*"
                                            r"expected null or a finite number"):
        parse_event(record, where="segment_000000.jsonl line 1")
    # Null or absent: the notice had no deadline.
    assert parse_event({"type": "preemption_notice", "t": 1, "deadline_t": None},
                       where="x") == PreemptionNotice(t=1)
    # In memory, leniently: the field is taken as absent.
    [event] = as_events([record])
    assert isinstance(event, PreemptionNotice) and event.deadline_t is None


def test_read_events_skips_records_with_numbers_beyond_a_double(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    events = tmp_path / "events"
    events.mkdir()
    lines = [
        {"type": "session_start", "t": 1.0},
        {"type": "preemption_notice", "t": 1, "deadline_t": HUGE},
        {"type": "commit", "index": 1, "t": 2.0, "seconds": 0.5, "bytes": HUGE},
        {"type": "blocked", "rank": 0, "kind": "report", "seconds": HUGE, "t": 2.5},
        {"type": "session_end", "t": HUGE, "status": "finished"},
        {"type": "session_end", "t": 3.0, "status": "finished"},
    ]
    (events / "segment_000000.jsonl").write_text(
        "".join(json.dumps(line) + "\n" for line in lines))
    with caplog.at_level(logging.WARNING):
        read = read_events(resolve(str(events)), RETRY)
    assert [e.type for e in read] == ["session_start", "session_end"]
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "Skipped 4 unreadable or invalid records" in warning
    assert "line 2 is invalid: field 'deadline_t'" in warning
    summary = summarize(read)
    assert summary.wall_s == 2.0 and summary.as_dict()["uploaded_bytes"] == 0.0


# --- bug B: absurd numbers in listed file names ------------------------------------------------


def test_a_segment_with_an_absurdly_long_number_is_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    planted = "segment_" + "1" * 199 + ".jsonl"
    (metrics / planted).write_text(json.dumps({"report_index": 1, "metrics": {}}) + "\n")
    directory = resolve(str(metrics))
    with caplog.at_level(logging.WARNING):
        log = SegmentLog(directory, RETRY)
    assert any("segment_1111" in r.getMessage() and "Ignoring 1 names" in r.getMessage()
               for r in caplog.records)
    log.append({"report_index": 2, "metrics": {"loss": 0.5}})
    log.flush()  # the next segment is segment_000000, a name the file system takes
    assert sorted(os.listdir(metrics)) == ["segment_000000.jsonl", planted]
    assert read_log(directory, RETRY) == [{"report_index": 2, "metrics": {"loss": 0.5}}]


@pytest.mark.parametrize("planted", [
    "segment_\u0661\u0662\u0663\u0664\u0665\u0666.jsonl",  # Arabic-Indic digits
    "segment_\uff11\uff12\uff13\uff14\uff15\uff16.jsonl",  # fullwidth digits
    "segment_" + "9" * 13 + ".jsonl",
])
def test_a_segment_number_that_is_not_one_cairn_writes_is_ignored(
    tmp_path: Path, planted: str
) -> None:
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    (log_dir / planted).write_text('{"i": 0}\n')
    (log_dir / "segment_000004.jsonl").write_text('{"i": 4}\n')
    directory = resolve(str(log_dir))
    log = SegmentLog(directory, RETRY)
    log.append({"i": 5})
    log.flush()
    assert (log_dir / "segment_000005.jsonl").exists()
    assert read_log(directory, RETRY) == [{"i": 4}, {"i": 5}]


def test_segments_past_six_digits_still_count_and_leading_zeros_do_not(
    tmp_path: Path
) -> None:
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    (log_dir / "segment_1234567.jsonl").write_text('{"i": 0}\n')  # as Cairn names it
    (log_dir / "segment_0001234568.jsonl").write_text('{"i": -1}\n')  # not as Cairn does
    directory = resolve(str(log_dir))
    log = SegmentLog(directory, RETRY)
    log.append({"i": 1})
    log.flush()
    assert (log_dir / "segment_1234568.jsonl").exists()
    assert read_log(directory, RETRY) == [{"i": 0}, {"i": 1}]


def test_a_segment_at_the_last_number_is_a_clear_error(tmp_path: Path) -> None:
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    (log_dir / "segment_999999999999.jsonl").write_text('{"i": 0}\n')
    directory = resolve(str(log_dir))
    assert read_log(directory, RETRY) == [{"i": 0}]
    with pytest.raises(ManifestError, match=r"The log .*log holds segment_999999999999\.jsonl "
                                            r"or a writer's claim of it, the last segment "
                                            r"number .* Remove it"):
        SegmentLog(directory, RETRY)


def test_a_lease_claim_with_an_absurdly_long_number_is_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    planted = CLAIM_PREFIX + "9" * 242  # 255 bytes: the next generation's is 256
    (tmp_path / planted).write_bytes(b"")
    (tmp_path / (CLAIM_PREFIX + "\u0663")).write_bytes(b"")  # an Arabic-Indic 3
    (tmp_path / (CLAIM_PREFIX + "007")).write_bytes(b"")  # Cairn writes no leading zeros
    run = resolve(str(tmp_path))
    assert claim_names(run, RETRY) == {}
    lease = RunLease(run, RETRY)
    with caplog.at_level(logging.WARNING):
        lease.acquire()
    try:
        assert lease.generation == 1
        assert (tmp_path / f"{CLAIM_PREFIX}1").exists()
        assert any("3 names" in r.getMessage() and "not lease claims Cairn wrote"
                   in r.getMessage() for r in caplog.records)
    finally:
        lease.release()
    assert (tmp_path / planted).exists()  # not Cairn's: left alone


def test_a_lease_with_a_generation_beyond_a_claim_name_is_taken_over(tmp_path: Path) -> None:
    (tmp_path / LEASE_NAME).write_bytes(lease_bytes(generation=10**250))
    with pytest.raises(ManifestError, match=r"field 'generation' is 1000.*251 digits.*"
                                            r"expected an integer <= 999999999999"):
        LeaseInfo.from_json((tmp_path / LEASE_NAME).read_bytes())
    lease = RunLease(resolve(str(tmp_path)), RETRY)
    lease.acquire()
    try:
        assert lease.generation == 1
    finally:
        lease.release()


def test_a_claim_at_the_last_generation_is_a_clear_error_that_lease_break_clears(
    tmp_path: Path
) -> None:
    last = f"{CLAIM_PREFIX}{10**12 - 1}"
    (tmp_path / last).write_bytes(b"")
    run = resolve(str(tmp_path))
    with pytest.raises(RunLeaseError, match=rf"{last}.*cairn lease break"):
        RunLease(run, RETRY).acquire()
    break_lease(run, RETRY)
    assert not (tmp_path / last).exists()
    lease = RunLease(run, RETRY)
    lease.acquire()
    try:
        assert lease.generation == 1
    finally:
        lease.release()
