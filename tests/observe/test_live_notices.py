"""What ``fit()`` says at the default progress level: which run it starts or continues and
from which checkpoint, that a run already finished, and how to allow restarts when a
failure ends the run."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import live_workloads
import pytest

import cairn
from cairn import FailureConfig, ScalingConfig, Trainer, TrainingFailedError
from cairn._src.observe.live_state import give_up_notice, start_notice


def _notices(err: str) -> list[str]:
    return [line for line in err.splitlines()
            if line.startswith("cairn: ") and " | uploads: " not in line]


def _fit(run_config: Callable[..., cairn.RunConfig], config: dict[str, object],
         name: str = "run") -> cairn.Result:
    return Trainer(live_workloads.steps_with_checkpoints, train_loop_config=config,
                   scaling_config=ScalingConfig(num_workers=2),
                   run_config=run_config(name=name, failure_config=FailureConfig(
                       max_failures=0))).fit()


def test_the_default_level_says_which_run_starts_continues_or_gives_up(
        run_config: Callable[..., cairn.RunConfig], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("CAIRN_PROGRESS", raising=False)
    where = str(tmp_path / "storage" / "run")
    _fit(run_config, {"steps": 2})
    assert _notices(capfd.readouterr().err) == [f"cairn: starting run 'run' at {where}"]

    again = _fit(run_config, {"steps": 2})
    notices = _notices(capfd.readouterr().err)
    assert len(notices) == 1, notices
    # As the notice says, and as Result.from_path reads it: the last report's metrics.
    assert again.metrics is not None and again.metrics["step"] == 1
    assert again.metrics == cairn.Result.from_path(where).metrics
    assert notices[0].startswith(
        f"cairn: run 'run' at {where} already finished in an earlier fit(); this fit() "
        "continues it from checkpoint_000002 (report 2): "), notices
    assert "the Result holds the run's checkpoints" in notices[0]

    marker = str(tmp_path / "crashed")
    with pytest.raises(TrainingFailedError):
        _fit(run_config, {"steps": 4, "crash_marker": marker, "crash_after": 1}, name="other")
    notices = _notices(capfd.readouterr().err)
    assert notices[0] == f"cairn: starting run 'other' at {tmp_path / 'storage' / 'other'}"
    assert notices[1].startswith(
        "cairn: attempt 0 failed and FailureConfig(max_failures=0) allows no restart: "
        "RunConfig(failure_config=FailureConfig(max_failures=N)) restarts up to N times"), \
        notices
    assert notices[1].endswith("running the script again continues run 'other' from "
                               "checkpoint_000002"), notices


def test_level_0_says_nothing(run_config: Callable[..., cairn.RunConfig],
                              capfd: pytest.CaptureFixture[str]) -> None:
    Trainer(live_workloads.steps_with_checkpoints, train_loop_config={"steps": 1},
            scaling_config=ScalingConfig(num_workers=1),
            run_config=run_config(progress=0)).fit()
    assert "cairn: " not in capfd.readouterr().err


def test_the_texts_of_the_notices() -> None:
    assert start_notice("r", "/runs/r", attempts=2, checkpoints=0, resume=None,
                        resume_report=None, finished_before=False) == (
        "continuing run 'r' at /runs/r from scratch (no committed checkpoint yet), attempt 3")
    assert give_up_notice("r", attempt=3, max_failures=2, fatal=False, latest=None) == (
        "attempt 3 failed and the 2 restarts FailureConfig(max_failures=2) allows are spent; "
        "running the script again continues run 'r' from scratch (no committed checkpoint)")
    assert give_up_notice("r", attempt=0, max_failures=5, fatal=True,
                          latest="checkpoint_000004") == (
        "attempt 0 failed on a mistake a restart would repeat; once it is fixed, running the "
        "script again continues run 'r' from checkpoint_000004")
