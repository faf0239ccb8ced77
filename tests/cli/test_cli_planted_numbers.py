"""The CLI on run files holding numbers no double holds (``10**400`` is valid JSON): a
malformed lease is cleared by ``cairn lease break``, bad event records are skipped, and
whatever arithmetic might still overflow is one line and exit 2, never a traceback."""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from cairn._src.cli import runs
from cairn._src.cli.main import main
from cairn._src.run.layout import EVENTS_DIR, INDEX_NAME, LEASE_NAME

HUGE = 10**400


def make_run(tmp_path: Path, events: list[dict[str, Any]]) -> Path:
    run = tmp_path / "run"
    (run / EVENTS_DIR).mkdir(parents=True)
    (run / INDEX_NAME).write_text(json.dumps({"version": 1, "checkpoints": []}))
    (run / EVENTS_DIR / "segment_000000.jsonl").write_text(
        "".join(json.dumps(event) + "\n" for event in events))
    return run


@pytest.mark.parametrize("fields", [{"ttl_s": HUGE}, {"heartbeat_at": HUGE},
                                    {"heartbeat_at": -HUGE, "ttl_s": HUGE},
                                    {"generation": HUGE}])
@pytest.mark.parametrize("as_json", [False, True])
def test_lease_break_clears_a_lease_holding_a_huge_number(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fields: dict[str, Any], as_json: bool
) -> None:
    run = make_run(tmp_path, [{"type": "session_start", "t": 1.0}])
    lease = {"version": 1, "host": "elsewhere", "pid": 4242, "token": "f" * 32,
             "heartbeat_at": time.time(), "ttl_s": 30.0, "generation": 1, **fields}
    (run / LEASE_NAME).write_text(json.dumps(lease))
    code = main(["lease", "break", str(run), *(["--json"] if as_json else [])])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert not (run / LEASE_NAME).exists()
    if as_json:
        assert json.loads(out)["previous"] is None
    else:
        assert "(there was no readable lease)" in out


def test_goodput_skips_events_holding_huge_numbers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    run = make_run(tmp_path, [
        {"type": "session_start", "t": 1.0},
        {"type": "commit", "index": 1, "t": 2.0, "seconds": 0.5, "bytes": HUGE},
        {"type": "preemption_notice", "t": 2.5, "deadline_t": HUGE},
        {"type": "session_end", "t": 3.0, "status": "finished"},
    ])
    with caplog.at_level(logging.WARNING):
        assert main(["goodput", str(run), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["wall_s"] == 2.0 and summary["uploaded_bytes"] == 0.0
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "Skipped 2 unreadable or invalid records" in warning
    assert "field 'bytes' is 1000" in warning and "401 digits" in warning


@pytest.mark.parametrize("as_json", [False, True])
def test_an_overflow_that_still_happens_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    as_json: bool
) -> None:
    def overflowing(args: argparse.Namespace) -> int:
        return int(float(HUGE))

    monkeypatch.setattr(runs, "cmd_lease_break", overflowing)
    code = main(["lease", "break", str(tmp_path), *(["--json"] if as_json else [])])
    out, err = capsys.readouterr()
    assert code == 2
    [line] = err.splitlines()
    assert line == ("cairn lease break: error: a number in the run's files is out of range: they "
                    "are not files Cairn wrote (OverflowError: int too large to convert to "
                    "float)")
    if as_json:
        assert json.loads(out)["error"].startswith("a number in the run's files")
