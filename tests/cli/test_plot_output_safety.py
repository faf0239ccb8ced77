"""``cairn plot`` and ``cairn goodput`` read an untrusted event log (written before the
driver masked credentials, or forged): like ``cairn show``, their ``--json`` and the notes
under their charts mask the credentials of a URI a failure's message or reason holds, and
their ``--json`` is strict JSON (docs/cli.md) whatever numbers the log holds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cairn._src.cli.main import main
from cairn._src.goodput.timeline import build_timeline
from cairn._src.plots.drawing import metric_notes, timeline_notes
from cairn._src.plots.series import build_plot
from cairn._src.run.layout import EVENTS_DIR, INDEX_NAME, METRICS_DIR

SECRET = "wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY"
KEY_ID = "AKIAIOSFODNN7EXAMPLE"
URI = f"s3://{KEY_ID}:{SECRET}@bucket/x"
TOKEN_URI = "gs://bucket/y?token=tok3nS3cret&region=eu"


def _strict(text: str) -> Any:
    def refuse(constant: str) -> Any:
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def _write(path: Path, records: list[dict[str, Any]]) -> None:
    path.mkdir(parents=True)
    (path / "segment_000000.jsonl").write_text(
        "".join(json.dumps(record) + "\n" for record in records))


def _events(t0: float, t1: float, t2: float) -> list[dict[str, Any]]:
    return [
        {"type": "session_start", "t": t0},
        {"type": "attempt_start", "attempt": 0, "t": t0, "resume": None},
        {"type": "failure", "attempt": 0, "t": t1, "ranks": [0],
         "reason": f"[rank 0] upload to {URI} failed ({TOKEN_URI})",
         "errors": [{"type": "OSError", "ranks": [0],
                     "message": f"could not write {URI}: denied ({TOKEN_URI})"}]},
        {"type": "attempt_start", "attempt": 1, "t": t2, "resume": None},
        {"type": "session_end", "t": t2, "status": "finished"},
    ]


def _records(t0: float, t2: float) -> list[dict[str, Any]]:
    return [{"report_index": 1, "attempt": 0, "time": t0, "metrics": {"loss": 1.0}},
            {"report_index": 2, "attempt": 1, "time": t2, "metrics": {"loss": 0.5}}]


def _run(tmp_path: Path, t0: float = 100.0, t1: float = 105.0, t2: float = 106.0) -> Path:
    run = tmp_path / "run"
    _write(run / EVENTS_DIR, _events(t0, t1, t2))
    _write(run / METRICS_DIR, _records(t0, t2))
    (run / INDEX_NAME).write_text(json.dumps({"version": 1, "checkpoints": []}))
    return run


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    assert code == 0, err
    assert SECRET not in out + err and "tok3nS3cret" not in out + err
    return out


def test_plot_json_masks_the_credentials_a_failure_message_holds(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _cli(capsys, "plot", str(_run(tmp_path)), "--metric", "loss", "--json")
    [restart] = _strict(out)["restarts"]
    assert restart["reason"] == ("[rank 0] upload to s3://AKIAIOSFODNN7EXAMPLE:***@bucket/x "
                                 "failed (gs://bucket/y?token=***&region=eu)")
    assert restart["errors"] == [{
        "type": "OSError", "ranks": [0],
        "message": "could not write s3://AKIAIOSFODNN7EXAMPLE:***@bucket/x: denied "
                   "(gs://bucket/y?token=***&region=eu)"}]
    assert restart["label"] == "rank 0: OSError"


def test_goodput_json_and_text_show_no_credentials(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = str(_run(tmp_path))
    assert _strict(_cli(capsys, "goodput", run, "--json"))["failures"] == 1.0
    _cli(capsys, "goodput", run)
    _cli(capsys, "plot", run, "--metric", "loss")


def test_the_notes_under_the_charts_mask_credentials(tmp_path: Path) -> None:
    events, records = _events(100.0, 105.0, 106.0), _records(100.0, 106.0)
    [plot_note] = metric_notes(build_plot("run", records, events, {}, ["loss"]))
    [timeline_note] = timeline_notes(build_timeline(events))
    for note in (plot_note, timeline_note):
        assert SECRET not in note and "tok3nS3cret" not in note
        assert "attempt 0 failed: rank 0: OSError (could not write " \
               "s3://AKIAIOSFODNN7EXAMPLE:***@bucket/x" in note


def test_a_long_message_is_masked_before_it_is_shortened() -> None:
    # Shortened first, the detail would cut the URI before its '@': the password, then
    # no longer part of a URI with credentials, would be left whole.
    message = "x" * 70 + f" {URI}"
    events = [{"type": "session_start", "t": 1.0},
              {"type": "attempt_start", "attempt": 0, "t": 1.0, "resume": None},
              {"type": "failure", "attempt": 0, "t": 2.0, "ranks": [0], "reason": message,
               "errors": [{"type": "OSError", "ranks": [0], "message": message}]}]
    records = [{"report_index": 1, "attempt": 0, "time": 1.5, "metrics": {"loss": 1.0}}]
    notes = [*metric_notes(build_plot("run", records, events, {}, ["loss"])),
             *timeline_notes(build_timeline(events))]
    assert len(notes) == 2
    for note in notes:  # the detail keeps 5 characters of where the password was
        assert f"{KEY_ID}:***" in note and SECRET[:4] not in note


@pytest.mark.parametrize("x_axis", ["report", "time"])
def test_plot_json_of_a_log_with_huge_times_is_strict(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], x_axis: str) -> None:
    run = _run(tmp_path, t0=-1.5e308, t1=1.5e308, t2=1.6e308)
    document = _strict(_cli(capsys, "plot", str(run), "--metric", "loss", "--x", x_axis,
                            "--json"))
    [restart] = document["restarts"]
    assert restart["t"] is None  # 1.5e308 - -1.5e308 overflows to inf
    # A report whose time since the start overflows has no x: left out, as docs/plots.md
    # says of a report without a finite x ("x": [float] holds no null).
    xs = [x for series in document["series"] for x in series["x"]]
    assert None not in xs
    assert xs == ([1.0, 2.0] if x_axis == "report" else [0.0])


def test_goodput_json_of_a_log_with_huge_times_is_strict(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run(tmp_path, t0=-1.5e308, t1=1.5e308, t2=1.6e308)
    summary = _strict(_cli(capsys, "goodput", str(run), "--json"))
    assert summary["wall_s"] is None
