"""bench/survivor_goodput.py: the three sides' rows against the restart (measure faked),
and the per-step barrier of the shared goodput job with real worker processes."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH_DIR))

import _harness  # noqa: E402
import survivor_goodput  # noqa: E402

import cairn  # noqa: E402


def test_each_side_stands_against_the_restart_and_the_target(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    goodputs = {(): 0.80, (("warm_standby", True),): 0.93,
                (("keep_survivors", True), ("warm_standby", True)): 0.96}
    seen: list[dict[str, Any]] = []

    def fake(job: Any, work: Path, failure: dict[str, Any]) -> Any:
        seen.append(failure)
        own = cairn.GoodputSummary(wall_s=10.0, startup_s=0.5, checkpoint_blocked_s=0.0,
                                   recovery_s=0.1, lost_work_s=0.5, attempts=4, failures=3,
                                   uploaded_bytes=0)
        return {"goodput": goodputs[tuple(sorted(failure.items()))], "wall_s": 10.0,
                "redone_s": 0.5, "attempts": 4}, own

    monkeypatch.setattr(survivor_goodput, "measure", fake)
    rows = {row.metric: row for row in survivor_goodput.run(survivor_goodput.parse_args(
        ["--quick"]))}
    assert seen == list(survivor_goodput.SIDES.values())
    assert rows["goodput, restart"].reference is None
    standby = rows["goodput, restart, warm standby"]
    assert standby.reference == pytest.approx(0.80) and "MISSED" in standby.note
    kept = rows["goodput, keep_survivors, warm standby"]
    assert kept.ratio == pytest.approx(1.2)
    assert "target >= 0.95 and above the restart: met" in kept.note


def test_the_job_with_a_barrier_each_step_completes(tmp_path: Path) -> None:
    job = _harness.GoodputJob(duration_s=1.0, step_s=0.1, checkpoint_every_s=0.5,
                              crash_at=(0.35,), checkpoint_mib=0.0, step_barrier=True)
    summary, _ = survivor_goodput.measure(job, tmp_path, {"keep_survivors": True})
    assert summary["completed"] and summary["attempts"] == 2


def test_the_cadence_and_the_upload_mode_come_from_the_command_line() -> None:
    job = survivor_goodput.job_of(survivor_goodput.parse_args(
        ["--checkpoint-every-s", "0.25", "--async-upload"]))
    assert (job.checkpoint_every_steps, job.async_upload) == (1, True)
    assert job.crash_at == survivor_goodput.JOB.crash_at
    assert survivor_goodput.job_of(survivor_goodput.parse_args([])) == survivor_goodput.JOB


def test_the_job_with_async_checkpoints_resumes_from_the_latest_upload(tmp_path: Path) -> None:
    job = _harness.GoodputJob(duration_s=1.0, step_s=0.1, checkpoint_every_s=0.1,
                              crash_at=(0.55,), checkpoint_mib=0.5, step_barrier=True,
                              async_upload=True)
    summary, _ = survivor_goodput.measure(job, tmp_path, {"keep_survivors": True})
    assert summary["completed"] and summary["attempts"] == 2
    scratch = list(tmp_path.glob("goodput_step[0-9]*"))
    assert not scratch, "each scratch directory went once uploaded"
