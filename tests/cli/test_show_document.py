"""``cairn show``'s document from an index and an event log written here: what real runs
rarely produce (validations, references with credentials, failures that do not count,
NaN metrics, malformed events), each checked in the text and against the documented
schema."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import doc_schema
import pytest

from cairn._src.checkpoint.index import CheckpointRecord, Retention, RunIndex, write_index
from cairn._src.cli.common import RETRY, print_json
from cairn._src.cli.main import main
from cairn._src.cli.show import checkpoint_statuses, format_show, show_document
from cairn._src.run.layout import EVENTS_DIR
from cairn._src.run.segment_log import SegmentLog
from cairn._src.storage.location import resolve

SECRET_URI = "s3://alice:hunter2@bucket/ckpt?X-Amz-Security-Token=tok3n"


def record(index: int, **fields: Any) -> CheckpointRecord:
    return CheckpointRecord(dir_name=f"checkpoint_{index:06d}", report_index=index,
                            size_bytes=3 * 2**20, **fields)


INDEX = RunIndex(
    checkpoints=(record(1, metrics={"loss": 0.5}), record(2, metrics={"loss": float("nan")}),
                 record(3, metrics={"loss": 0.2}, target_uri=SECRET_URI, managed=False)),
    next_report_index=4, attempts=2, failures=1, resumed_from="checkpoint_000001",
    retention=Retention(1, "loss", "min"))
EVENTS: list[Any] = [
    {"type": "session_start", "t": 100.0},
    {"type": "attempt_start", "attempt": 0, "t": 100.0},
    {"type": "validation_requested", "t": 101.0, "dir_name": "checkpoint_000001"},
    {"type": "validation_finished", "t": 102.0, "dir_name": "checkpoint_000001",
     "status": "VALIDATED"},
    {"type": "validation_requested", "t": 103.0, "dir_name": "checkpoint_000002"},
    {"type": "failure", "attempt": 0, "t": 104.0, "ranks": [0, 2],
     "reason": "[ranks 0, 2] CheckpointDamagedError: bad bytes", "counted": False,
     "errors": [{"type": "cairn.CheckpointDamagedError", "ranks": [0, 2],
                 "message": "bad bytes\nstate.txt: checksum mismatch"}]},
    {"type": "failure", "attempt": "one", "t": "late", "ranks": "all", "errors": 5},
    {"type": "blocked", "t": 1e300},
    "not an event",
    {"type": "attempt_start", "attempt": 1, "t": 105.0},
    {"type": "validation_finished", "dir_name": 7, "status": "VALIDATED"},
    {"type": "validation_finished", "dir_name": "checkpoint_000003", "status": "BOGUS"},
    {"type": "checkpoint_dropped", "dir_name": "checkpoint_000000",
     "reason": f"damaged at {SECRET_URI}"},
]


def document() -> dict[str, Any]:
    return show_document(resolve("/runs/r"), INDEX, EVENTS, None)


def test_statuses_come_from_the_validation_events() -> None:
    assert checkpoint_statuses(EVENTS) == {"checkpoint_000001": "VALIDATED",
                                           "checkpoint_000002": "PENDING_VALIDATION"}


def test_the_document_matches_the_documented_schema(capsys: pytest.CaptureFixture[str]) -> None:
    print_json(document())
    doc = json.loads(capsys.readouterr().out)  # strict JSON: the NaN loss became null
    doc_schema.check(doc, "show")
    assert doc["checkpoints"][1]["metrics"] == {"loss": None}
    assert doc["checkpoints"][1]["score"] is None


def test_an_interrupted_run_with_failures_that_do_not_count() -> None:
    doc = document()
    assert doc["status"] == "interrupted" and doc["error"] is None
    assert [f["counted"] for f in doc["failures"]] == [False, True]
    # The malformed failure is kept, with what could be read of it.
    assert doc["failures"][1] == {"attempt": None, "t": None, "ranks": [], "reason": "",
                                  "errors": [], "counted": True, "preemption": False}
    text = "\n".join(format_show(doc))
    assert ("attempt 0  ranks 0, 2: [ranks 0, 2] CheckpointDamagedError: bad bytes "
            "(not counted: the checkpoint it resumed from was damaged)") in text
    assert "      ranks 0, 2: cairn.CheckpointDamagedError: bad bytes" in text
    assert "        state.txt: checksum mismatch" in text
    assert "attempt -  the driver: (no reason recorded)" in text
    assert "attempts   2 attempts in 1 driver session, 2 failures" in text
    assert "last event t=1e+300" in text


def test_reasons_statuses_and_references_in_the_text() -> None:
    doc = document()
    by_name = {c["dir_name"]: c for c in doc["checkpoints"]}
    assert [r["code"] for r in by_name["checkpoint_000001"]["kept_because"]] == [
        "resumed_from"]
    assert [r["code"] for r in by_name["checkpoint_000002"]["kept_because"]] == [
        "pending_validation"]
    assert [r["code"] for r in by_name["checkpoint_000003"]["kept_because"]] == [
        "best", "latest"]
    assert by_name["checkpoint_000003"]["location"] == "reference"
    lines = {line.split()[0]: line for line in format_show(doc)
             if line.startswith("checkpoint_")}
    assert "validated" in lines["checkpoint_000001"]
    assert "pending validation" in lines["checkpoint_000002"]
    assert "3.00" in lines["checkpoint_000003"] and " ref " in lines["checkpoint_000003"]
    assert lines["checkpoint_000003"].endswith(
        "#1 of the best 1 by loss (min); the latest checkpoint")


def test_credentials_are_never_shown(capsys: pytest.CaptureFixture[str]) -> None:
    doc = document()
    print_json(doc)
    shown = capsys.readouterr().out + "\n".join(format_show(doc))
    assert "hunter2" not in shown and "tok3n" not in shown
    assert "s3://alice:***@bucket/ckpt" in shown
    assert doc["dropped_as_damaged"][0]["dir_name"] == "checkpoint_000000"


def test_a_failed_run_without_per_rank_errors_shows_its_reason(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = resolve(str(tmp_path / "r"))
    write_index(run, RunIndex(attempts=1), RETRY)
    log = SegmentLog(run.join(EVENTS_DIR), RETRY)
    for event in ({"type": "session_start", "t": 1.0}, {"type": "attempt_start", "t": 1.0},
                  {"type": "failure", "attempt": 0, "t": 2.0, "ranks": [1],
                   "reason": "rank 1 exited with signal 9"},
                  {"type": "session_end", "t": 3.0, "status": "failed"}):
        log.append(event)
    log.flush()
    assert main(["show", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "status     failed: error on rank 1: rank 1 exited with signal 9" in out
    assert "no committed checkpoints" in out
    assert "keeps      not recorded (the index was rebuilt from the manifests" in out
    assert "cairn prune needs --score or --latest" in out
    assert main(["show", str(tmp_path / "r"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    doc_schema.check(doc, "show")
    assert doc["error"] == {"type": "", "ranks": [1], "message": "rank 1 exited with signal 9"}
    assert doc["retention"] is None


FRAME_EVENTS: list[Any] = [
    {"type": "session_start", "t": 100.0},
    {"type": "attempt_start", "attempt": 0, "t": 100.0},
    {"type": "failure", "attempt": 0, "t": 101.0, "ranks": [1, 0],
     "reason": "[rank 1] ValueError: boom\x1b[2J (and 1 more)",
     "errors": [
         {"type": "ValueError", "ranks": [1], "message": "boom\x1b[2J",
          "frame": {"file": "/home/me/train.py", "line": 17, "function": "train_func"}},
         {"type": "RuntimeError", "ranks": [0], "message": "lost\x07 peer",
          "frame": {"file": "/home/me/train.py", "line": "17", "function": "f"}},
         {"type": "OSError", "ranks": [2], "message": "gone", "frame": ["not", "a frame"]},
     ]},
    # A run written before frames were recorded.
    {"type": "failure", "attempt": 1, "t": 102.0, "ranks": [0],
     "reason": "[rank 0] KeyError: 'k'",
     "errors": [{"type": "KeyError", "ranks": [0], "message": "'k'"}]},
]


def test_each_failed_rank_names_where_it_failed() -> None:
    doc = show_document(resolve("/runs/r"), RunIndex(attempts=2), FRAME_EVENTS, None)
    first, second = doc["failures"]
    assert [e["frame"] for e in first["errors"]] == [
        {"file": "/home/me/train.py", "line": 17, "function": "train_func"}, None, None]
    assert second["errors"][0]["frame"] is None
    text = "\n".join(format_show(doc))
    assert "rank 1 failed at /home/me/train.py:17, in train_func" in text, text
    # Text read from storage is printed with its control characters escaped.
    assert "\x1b" not in text and "\x07" not in text
    assert "[rank 1] ValueError: boom\\x1b[2J (and 1 more)" in text
    assert "rank 0: RuntimeError: lost\\x07 peer" in text


def test_a_request_counts_only_for_the_checkpoint_its_own_report_committed() -> None:
    # Report 3's commit failed after its request was logged; report 5 committed a
    # checkpoint of the same name, without a validation.
    epoch = CheckpointRecord(dir_name="epoch_1", report_index=5, size_bytes=1)
    stray = {"type": "validation_requested", "t": 1.0, "dir_name": "epoch_1", "index": 3}
    assert checkpoint_statuses([stray], [epoch]) == {}
    shown = show_document(resolve("/runs/r"), RunIndex(checkpoints=(epoch,)), [stray], None)
    assert [c["status"] for c in shown["checkpoints"]] == ["COMMITTED"]
    # Its own report's request, or one logged without a report index, counts.
    for index in (5, None):
        own = {**stray, "index": index}
        assert checkpoint_statuses([own], [epoch]) == {"epoch_1": "PENDING_VALIDATION"}
