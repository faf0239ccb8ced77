"""The schema validator: the run index, log records and the lease as Cairn reads them back
(issue 10, item 7). Messages name the file, the field and what was expected."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from cairn import ManifestError
from cairn._src.checkpoint.index import CheckpointRecord, RunIndex, read_index
from cairn._src.run import schema
from cairn._src.run.schema import nesting_depth, parse_lease
from cairn._src.run.segment_log import read_log
from cairn._src.storage.location import resolve
from cairn._src.storage.retry import RetryPolicy

RETRY = RetryPolicy(max_attempts=1)
WHERE = "/runs/r/cairn_run.json"


def index_json(**changes: Any) -> bytes:
    body = json.loads(RunIndex(checkpoints=(
        CheckpointRecord(dir_name="checkpoint_000001", report_index=1, metrics={"loss": 1.0}),
    )).to_json())
    body.update(changes)
    return json.dumps(body).encode()


def record(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"dir_name": "checkpoint_000001", "report_index": 1}
    base.update(changes)
    return base


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"checkpoints": "abc"},
         "field 'checkpoints' is 'abc' (str); expected a list of checkpoint records."),
        ({"checkpoints": [record(report_index="3")]},
         "field 'checkpoints[0].report_index' is '3' (str); expected an integer >= 0."),
        ({"checkpoints": [record(), record(dir_name="..", report_index=2)]},
         "field 'checkpoints[1].dir_name' is '..' (str); expected a checkpoint directory name "
         "(one path component, no '/', '\\\\' or '..')."),
        ({"checkpoints": [record(dir_name="../../home/me/data")]},
         "field 'checkpoints[0].dir_name' is '../../home/me/data' (str); expected a checkpoint "
         "directory name"),
        ({"checkpoints": [record(dir_name="/etc")]},
         "field 'checkpoints[0].dir_name' is '/etc' (str); expected a checkpoint directory name"),
        ({"checkpoints": [record(dir_name="metrics")]},
         "field 'checkpoints[0].dir_name' is 'metrics' (str); expected a checkpoint directory"),
        ({"checkpoints": [{"report_index": 1}]},
         "field 'checkpoints[0].dir_name' is missing; expected a checkpoint directory name"),
        ({"checkpoints": [record(managed="yes")]},
         "field 'checkpoints[0].managed' is 'yes' (str); expected true or false."),
        ({"checkpoints": [record(target_uri="relative/ckpt")]},
         "field 'checkpoints[0].target_uri' is 'relative/ckpt' (str); expected null or a URI "
         "with a scheme ('s3://bucket/ckpt') or an absolute path."),
        ({"checkpoints": [record(target_path="rel/path")]},
         "field 'checkpoints[0].target_path' is 'rel/path' (str); expected null or a "
         "normalized absolute path such as '/data/ckpt'."),
        ({"checkpoints": [record(metrics=[1, 2])]},
         "field 'checkpoints[0].metrics' is a list of 2 values; expected an object nested at "
         "most 128 levels deep."),
        ({"checkpoints": [7]},
         "field 'checkpoints[0]' is 7 (int); expected a checkpoint record (an object with "
         "'dir_name' and 'report_index')."),
        ({"next_report_index": 0}, "field 'next_report_index' is 0 (int); expected an integer "
                                   ">= 1."),
        ({"attempts": 1.5}, "field 'attempts' is 1.5 (float); expected an integer >= 0."),
        ({"failures": True}, "field 'failures' is True (bool); expected an integer >= 0."),
        ({"resumed_from": "a/b"}, "field 'resumed_from' is 'a/b' (str); expected null or a "
                                  "checkpoint directory name"),
        ({"updated_at": "yesterday"}, "field 'updated_at' is 'yesterday' (str); expected a "
                                      "finite number."),
    ],
)
def test_a_bad_index_field_is_named_with_what_was_expected(
    changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(ManifestError) as caught:
        RunIndex.from_json(index_json(**changes), where=WHERE)
    text = str(caught.value)
    assert text.startswith(f"The run index {WHERE} is invalid: {message}"), text
    assert text.endswith("Cairn rebuilds it from the checkpoint manifests (`cairn rebuild-index` "
                         "does it by hand).")


def test_nesting_deeper_than_the_parser_is_a_manifest_error() -> None:
    deep = b'{"version": 1, "checkpoints": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    with pytest.raises(ManifestError, match=r"^The run index /runs/r/cairn_run\.json is not a "
                       r"file Cairn wrote: its JSON is nested too deeply to parse\."):
        RunIndex.from_json(deep, where=WHERE)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"[1]", "has version None; this Cairn reads version 1"),
        (b'{"version": "1", "checkpoints": []}', "has version 'unreadable'; this Cairn reads"),
        (b'{"version": 1}', "is invalid: field 'checkpoints' is missing; expected a list of "
                            "checkpoint records."),
        (b"\xff\xfe", "is not valid JSON ("),
    ],
)
def test_unreadable_indexes(data: bytes, message: str) -> None:
    with pytest.raises(ManifestError, match=r"^The run index /runs/r/cairn_run\.json ") as caught:
        RunIndex.from_json(data, where=WHERE)
    assert message in str(caught.value)


def test_two_records_for_one_directory_are_refused() -> None:
    data = index_json(checkpoints=[record(), record(report_index=2)])
    with pytest.raises(ManifestError, match=r"is invalid: two checkpoint records name the "
                                            r"directory 'checkpoint_000001'\."):
        RunIndex.from_json(data, where=WHERE)


def test_a_valid_index_reads_and_unknown_fields_are_ignored(tmp_path: Path) -> None:
    data = index_json(written_by_newer_cairn={"x": 1},
                      checkpoints=[record(extra_field=3, metrics={"loss": float("nan")})])
    (tmp_path / "cairn_run.json").write_bytes(data)
    index = read_index(resolve(str(tmp_path)), RETRY)
    assert index is not None and index.checkpoints[0].dir_name == "checkpoint_000001"


def test_checking_is_linear_in_the_number_of_records() -> None:
    # 20,000 records, one bad at the end: one pass, and the message points at it.
    records = [record(dir_name=f"checkpoint_{i:06d}", report_index=i) for i in range(1, 20_001)]
    records[-1]["size_bytes"] = -1
    with pytest.raises(ManifestError, match=r"field 'checkpoints\[19999\]\.size_bytes' is -1"):
        RunIndex.from_json(index_json(checkpoints=records), where=WHERE)


def test_nesting_depth_is_measured_without_recursion() -> None:
    value: Any = []
    for _ in range(100_000):
        value = [value]
    assert nesting_depth(value, 64) == 65  # Stops counting past the limit.
    assert nesting_depth({"a": {"b": 1}, "c": [1, [2]]}, 64) == 3
    assert nesting_depth(3, 64) == 0


# --- log records -------------------------------------------------------------------------------

def write_segment(directory: Path, lines: list[str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "segment_000000.jsonl").write_text("\n".join(lines) + "\n")


def test_bad_metrics_records_are_skipped_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = tmp_path / "metrics"
    good = {"report_index": 1, "attempt": 0, "time": 1.0, "metrics": {"loss": 0.5}}
    write_segment(metrics, [
        json.dumps(good),
        json.dumps({**good, "report_index": "abc"}),
        json.dumps({**good, "metrics": "none"}),
        json.dumps({**good, "checkpoint_dir_name": "../x"}),
        "[" * 100_000,
        '{"torn": ',
        json.dumps([1, 2]),
        json.dumps({**good, "report_index": 2}),
    ])
    with caplog.at_level(logging.WARNING):
        records = read_log(resolve(str(metrics)), RETRY)
    assert [r["report_index"] for r in records] == [1, 2]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    text = warnings[0].getMessage()
    assert text.startswith(f"Skipped 6 unreadable or invalid records of {metrics}; the first: "
                           f"The metrics record {metrics}/segment_000000.jsonl line 2 is "
                           "invalid: field 'report_index' is 'abc' (str); expected an integer "
                           ">= 1. The record is skipped."), text


def test_bad_event_records_are_skipped(tmp_path: Path) -> None:
    events = tmp_path / "events"
    write_segment(events, [
        json.dumps({"type": "session_start", "t": 1.0}),
        json.dumps({"type": "commit", "t": "soon"}),
        json.dumps({"type": "blocked", "t": 2.0, "rank": -1, "seconds": 0.1}),
        json.dumps({"t": 3.0}),
        json.dumps({"type": "failure", "t": 4.0, "ranks": [0], "reason": "x",
                    "last_commit_t": 3.5, "attempt": 0}),
    ])
    records = read_log(resolve(str(events)), RETRY)
    assert [r["type"] for r in records] == ["session_start", "failure"]


def test_an_unknown_log_directory_accepts_any_object(tmp_path: Path) -> None:
    other = tmp_path / "other"
    write_segment(other, [json.dumps({"anything": 1}), json.dumps("not an object")])
    assert read_log(resolve(str(other)), RETRY) == [{"anything": 1}]


# --- the lease ---------------------------------------------------------------------------------

LEASE = {"version": 1, "host": "h", "pid": 12, "token": "t" * 32, "heartbeat_at": 1.0,
         "ttl_s": 30.0}


def test_a_valid_lease_parses() -> None:
    assert parse_lease(json.dumps(LEASE).encode(), where="/r/lease.json") == LEASE


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"pid": "12"}, "field 'pid' is '12' (str); expected an integer."),
        ({"heartbeat_at": None}, "field 'heartbeat_at' is None (NoneType); expected a finite "
                                 "number."),
        ({"ttl_s": float("inf")}, "field 'ttl_s' is inf (float); expected a finite number."),
        ({"token": ""}, "field 'token' is '' (str); expected a non-empty string."),
        ({"generation": -1}, "field 'generation' is -1 (int); expected an integer >= 0."),
    ],
)
def test_a_bad_lease_names_the_field(changes: dict[str, Any], message: str) -> None:
    data = json.dumps({**LEASE, **changes}).encode()
    with pytest.raises(ManifestError) as caught:
        parse_lease(data, where="/r/lease.json")
    assert str(caught.value) == (f"The lease /r/lease.json is invalid: {message} It is not a "
                                 "lease Cairn wrote.")


def test_a_lease_that_is_not_json() -> None:
    with pytest.raises(ManifestError, match=r"^The lease /r/lease\.json is not valid JSON"):
        parse_lease(b"{", where="/r/lease.json")
    deep = b"[" * 200_000
    with pytest.raises(ManifestError, match="nested too deeply to parse"):
        parse_lease(deep, where="/r/lease.json")


def test_check_value_reports_without_raising() -> None:
    assert schema.check_value({"a": 1}, schema.Object({"a": schema.COUNT})) is None
    assert schema.check_value({"a": -1}, schema.Object({"a": schema.COUNT})) == (
        "field 'a' is -1 (int); expected an integer >= 0")
