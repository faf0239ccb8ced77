"""A driver killed while it flushed the event log or the metrics history leaves the
temporary file of that segment's atomic write (``segment_NNNNNN.jsonl.cairn-tmp-<32
hex>``) under ``events/`` or ``metrics/``: the next start deletes it, and nothing else
named with the mark there."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest

from cairn import CheckpointConfig
from cairn._src.checkpoint.index import RunIndex, write_index
from cairn._src.checkpoint.opening import open_run
from cairn._src.run.layout import EVENTS_DIR, METRICS_DIR
from cairn._src.run.segment_log import SegmentLog, read_log
from cairn._src.storage.location import resolve
from cairn._src.storage.retry import RetryPolicy

RETRY = RetryPolicy()


def test_a_start_deletes_the_torn_writes_of_log_segments_and_nothing_else(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run = resolve(str(run_dir))
    write_index(run, RunIndex(next_report_index=1), RETRY)
    for log in (EVENTS_DIR, METRICS_DIR):
        written = SegmentLog(run.join(log), RETRY)
        written.append({"type": "attempt_start", "t": 1.0} if log == EVENTS_DIR
                       else {"report_index": 1, "metrics": {"a": 1}})
        written.flush()
    torn = [f"segment_{n}.jsonl.cairn-tmp-{uuid.uuid4().hex}"
            for n in ("000000", "000001", "1234567")]
    # Named with the mark, but not a torn segment write: left in place, with a warning.
    kept = sorted(["notes.cairn-tmp-x",
                   f"segment_00001.jsonl.cairn-tmp-{uuid.uuid4().hex}",  # not a segment's
                   f"cairn_run.json.cairn-tmp-{uuid.uuid4().hex}",  # not written there
                   f"segment_000002.jsonl.cairn-tmp-{uuid.uuid4().hex[:31]}"])
    as_dir = f"segment_000003.jsonl.cairn-tmp-{uuid.uuid4().hex}"
    for log in (EVENTS_DIR, METRICS_DIR):
        for name in torn:
            (run_dir / log / name).write_bytes(b'{"type":')
        for name in kept:
            (run_dir / log / name).write_bytes(b"mine")
        (run_dir / log / as_dir).mkdir()

    with caplog.at_level(logging.WARNING):
        open_run(run, CheckpointConfig(), RETRY)

    left = sorted([*kept, as_dir])
    for log in (EVENTS_DIR, METRICS_DIR):
        assert sorted(p.name for p in (run_dir / log).iterdir()) == sorted(
            ["segment_000000.jsonl", *left])
        assert (run_dir / log / "notes.cairn-tmp-x").read_bytes() == b"mine"
        assert len(read_log(run.join(log), RETRY)) == 1
        warnings = [r.getMessage() for r in caplog.records
                    if "temporary-file mark" in r.getMessage()
                    and run.join(log).display() in r.getMessage()]
        assert len(warnings) == 1 and repr(left) in warnings[0], warnings
