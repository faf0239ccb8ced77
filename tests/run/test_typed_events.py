"""The typed events of the event log (issue 27, item 2): each record the controller writes
is one type whose ``to_record()`` is the record on storage, and a record read back becomes
that type again, checked with the event log's schema and its messages."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest

from cairn import ManifestError
from cairn._src.run import events
from cairn._src.run.events import (
    EVENT_TYPES,
    ErrorInfo,
    Event,
    Failure,
    SessionEnd,
    UnknownEvent,
    as_events,
    parse_event,
    read_events,
)
from cairn._src.storage.location import resolve
from cairn._src.storage.retry import RetryPolicy

RETRY = RetryPolicy(max_attempts=1)
WHERE = "/runs/r/events/segment_000000.jsonl line 3"
FRAME = {"file": "train.py", "line": 12, "function": "train"}

# Each record as the controller, the commit pipeline, the validations and the checkpoint
# manager write it today (controller.py, commit_pipeline.py, validations.py, manager.py,
# ownership.py).
RECORDS: list[dict[str, Any]] = [
    {"type": "session_start", "t": 1.0},
    {"type": "attempt_start", "attempt": 0, "t": 1.5, "resume": None},
    {"type": "attempt_start", "attempt": 1, "t": 9.0, "resume": "checkpoint_000002"},
    {"type": "workers_ready", "attempt": 0, "t": 2.0},
    {"type": "train_start", "attempt": 0, "t": 2.5},
    {"type": "blocked", "rank": 1, "kind": "report", "seconds": 0.25, "t": 3.0, "index": 2},
    {"type": "blocked", "rank": 0, "kind": "report", "seconds": 0.5, "t": 3.0, "index": None},
    {"type": "first_report", "attempt": 0, "t": 3.0},
    {"type": "checkpoint_started", "dir_name": "checkpoint_000002", "index": 2, "t": 3.1},
    {"type": "commit", "index": 2, "t": 4.0, "seconds": 0.9, "bytes": 4096},
    {"type": "failure", "attempt": 0, "t": 8.0, "ranks": [1, 0], "reason": "rank 1 died",
     "last_commit_t": 4.0, "errors": [
         {"type": "cairn.WorkerProcessError", "ranks": [1], "message": "killed",
          "frame": None},
         {"type": "ValueError", "ranks": [0], "message": "x", "frame": FRAME}],
     "counted": False},
    {"type": "preemption_notice", "t": 7.0, "attempt": 0, "ranks": [0, 1],
     "nodes": ["local"], "deadline_t": 127.0, "source": "SIGTERM"},
    {"type": "failure", "attempt": 0, "t": 8.5, "ranks": [0, 1], "reason": "deadline passed",
     "last_commit_t": 4.0, "errors": [], "counted": False, "preemption": True},
    {"type": "deletions_failed", "dir_names": ["checkpoint_000001"], "t": 10.0},
    {"type": "train_end", "attempt": 1, "t": 10.5},
    {"type": "validation_requested", "t": 4.5, "dir_name": "checkpoint_000002", "index": 2,
     "task": {"fn": "val"}},
    {"type": "validation_finished", "t": 5.0, "dir_name": "checkpoint_000002", "index": 2,
     "status": "VALIDATED", "metrics": {"acc": 0.9}},
    {"type": "checkpoint_dropped", "dir_name": "checkpoint_000002", "report_index": 2,
     "reason": "damaged", "t": 9.5},
    {"type": "checkpoint_deleting", "dir_name": "checkpoint_000001", "report_index": 1,
     "reason": "retention", "t": 9.75},
    {"type": "reference_registered", "dir_name": "ref_a", "report_index": 3,
     "target_uri": "xyz://bucket/a", "target_path": None, "t": 6.0},
    {"type": "restore_planned", "t": 9.0, "attempt": 1, "rank": 1, "kind": "peer",
     "index": 2, "peer": 0, "reason": "a replaced rank; from peer rank 0"},
    {"type": "restored", "t": 9.2, "rank": 1, "kind": "peer+storage", "index": 2, "peer": 0,
     "memory_bytes": 0, "peer_bytes": 4096, "bytes": 12, "seconds": 0.1,
     "reason": "no verified copy of ['rank_1/rank_state.pt'] in memory"},
    {"type": "restored", "t": 9.3, "rank": 1, "kind": "peer", "index": 2, "peer": 0,
     "memory_bytes": 0, "peer_bytes": 4096, "bytes": 0, "seconds": 0.2,
     "reason": "a replaced rank; from peer rank 0", "prefetched": True},
    {"type": "restored", "t": 9.4, "rank": 1, "kind": "peer+driver", "index": 2, "peer": 0,
     "memory_bytes": 0, "peer_bytes": 4096, "bytes": 0, "seconds": 0.2,
     "reason": "a replaced rank; from peer rank 0", "driver_bytes": 12, "prefetched": True},
    {"type": "session_end", "t": 11.0, "status": "finished"},
    {"type": "session_end", "t": 11.0, "status": "interrupted"},
    {"type": "session_end", "t": 11.0, "status": "failed",
     "error": {"type": "ValueError", "ranks": [0], "message": "x"}},
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: str(r["type"]))
def test_each_record_round_trips_through_its_type(record: dict[str, Any]) -> None:
    event = parse_event(json.loads(json.dumps(record)), where=WHERE)
    assert type(event) is EVENT_TYPES[record["type"]]
    assert event.type == record["type"]
    assert event.to_record() == record


def test_every_type_has_a_record() -> None:
    assert set(EVENT_TYPES) == {r["type"] for r in RECORDS}


def test_fields_read_back_typed() -> None:
    failure = parse_event(RECORDS[10], where=WHERE)
    assert isinstance(failure, Failure)
    assert failure.ranks == (1, 0) and failure.counted is False
    assert failure.errors[1] == ErrorInfo("ValueError", (0,), "x")
    assert failure.errors[1].frame == FRAME
    end = parse_event(RECORDS[-1], where=WHERE)
    assert end == SessionEnd(t=11.0, status="failed", error=ErrorInfo("ValueError", (0,), "x"))


@pytest.mark.parametrize(("record", "message"), [
    ({"type": "commit", "t": "soon"},
     "The event record {where} is invalid: field 't' is 'soon' (str); expected a finite "
     "number. The record is skipped."),
    ({"type": "blocked", "t": 2.0, "rank": -1, "seconds": 0.1},
     "field 'rank' is -1 (int); expected an integer >= 0"),
    ({"t": 3.0}, "field 'type' is missing; expected a non-empty string"),
    ({"type": "failure", "t": 1.0, "ranks": [True]},
     "field 'ranks[0]' is True (bool); expected an integer >= 0"),
    ({"type": "checkpoint_started", "t": 1.0, "dir_name": "../x"},
     "field 'dir_name' is '../x' (str); expected a checkpoint directory name"),
    ([1, 2], "the document is a list of 2 values; expected an event record"),
])
def test_a_malformed_record_gets_the_schema_message(record: object, message: str) -> None:
    with pytest.raises(ManifestError, match=re.escape(message.replace("{where}", WHERE))):
        parse_event(record, where=WHERE)


def test_an_unknown_type_is_kept_whole() -> None:
    record = {"type": "from_the_future", "t": 5.0, "x": [1]}
    event = parse_event(record, where=WHERE)
    assert isinstance(event, UnknownEvent)
    assert (event.type, event.t, event.to_record()) == ("from_the_future", 5.0, record)


def test_fields_beyond_the_schema_are_lenient_as_the_readers_were() -> None:
    failure = parse_event({"type": "failure", "t": 1.0, "errors": [{"type": 1}, "x", {
        "type": "E", "message": "m", "ranks": [True, 2]}]}, where=WHERE)
    assert isinstance(failure, Failure)
    assert failure.errors == (ErrorInfo("E", (2,), "m"),)
    assert (failure.ranks, failure.reason, failure.counted) == ((), None, True)
    end = parse_event({"type": "session_end", "t": 2.0, "status": 7, "error": ["x"]},
                      where=WHERE)
    assert end == SessionEnd(t=2.0)
    older = parse_event({"type": "failure", "t": 3.0, "attempt_t": 2.0}, where=WHERE)
    assert older.to_record()["attempt_t"] == 2.0


def test_as_events_takes_records_in_memory_leniently() -> None:
    typed = events.Commit(t=1.0, index=1)
    parsed = as_events([typed, {"type": "session_start", "t": 0.5}, 7, None, {"t": 1.0},
                        {"type": "", "t": 1.0}, {"type": 5, "t": 1.0},
                        {"type": "commit", "t": float("nan"), "bytes": 3},
                        {"type": "attempt_start", "attempt": "zero", "t": 2.0},
                        {"type": "failure", "t": "late", "ranks": [True, 2, -1], "reason": 7}])
    assert parsed == [typed, events.SessionStart(t=0.5), events.Commit(t=None, bytes=3),
                      events.AttemptStart(t=2.0), Failure(t=None, ranks=(2,))]
    assert all(isinstance(e, Event) for e in parsed)
    unknown = as_events([{"type": "newer", "t": "x"}])
    assert isinstance(unknown[0], UnknownEvent) and unknown[0].t is None


def test_read_events_parses_the_log_and_skips_bad_records(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "events"
    directory.mkdir()
    lines = [json.dumps(RECORDS[0]), json.dumps({"type": "commit", "t": "soon"}),
             json.dumps(RECORDS[10])]
    (directory / "segment_000000.jsonl").write_text("\n".join(lines) + "\n")
    with caplog.at_level(logging.WARNING):
        read = read_events(resolve(str(directory)), RETRY)
    assert [e.to_record() for e in read] == [RECORDS[0], RECORDS[10]]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert (f"The event record {directory}/segment_000000.jsonl line 2 is invalid: field 't' "
            "is 'soon' (str); expected a finite number. The record is skipped.") in warnings[0]
