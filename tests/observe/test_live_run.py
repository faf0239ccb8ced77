"""The live view during real runs: 2 worker processes, local storage, stderr not a TTY."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import live_workloads
import pytest

import cairn
from cairn import FailureConfig, ScalingConfig, Trainer, ValidationConfig


def _view_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("cairn: ")]


def _status_lines(err: str) -> list[str]:
    return [line for line in _view_lines(err) if " | uploads: " in line]


def _fit(run_config: Callable[..., cairn.RunConfig], config: dict[str, object], *,
         progress: int | None, validation: bool = False) -> cairn.Result:
    return Trainer(
        live_workloads.steps_with_checkpoints,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=run_config(progress=progress,
                              failure_config=FailureConfig(max_failures=1)),
        validation_config=ValidationConfig(live_workloads.validate) if validation else None,
    ).fit()


@pytest.fixture
def short_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAIRN_PROGRESS_INTERVAL", "0.2")


def test_status_lines_show_steps_commits_and_the_restart(
    run_config: Callable[..., cairn.RunConfig], tmp_path: Path, short_interval: None,
    capfd: pytest.CaptureFixture[str],
) -> None:
    marker = str(tmp_path / "crashed")
    result = _fit(run_config, {"steps": 4, "sleep_s": 0.3, "crash_marker": marker,
                               "crash_after": 1}, progress=1)
    assert result.metrics["step"] == 3
    err = capfd.readouterr().err
    status = _status_lines(err)
    # At least one line while training (every 0.2 s over more than a second) and the
    # final one when fit() ends.
    assert len(status) >= 2, err
    # Level 1 prints status lines and the notices (here: which run starts).
    others = [line for line in _view_lines(err) if line not in status]
    assert len(others) == 1 and others[0].startswith("cairn: starting run 'run' at "), others
    final = status[-1]
    # Report numbers go on after the restart (rank 0 may have made report 3 before it).
    assert re.search(r"^cairn: report [45] step=3 loss=0\.25 \| ", final), final
    assert "uploads: none pending" in final
    assert result.checkpoint is not None
    last = result.checkpoint.path.rstrip("/").rsplit("/", 1)[-1]
    assert re.search(rf"last commit: {last} \d+(\.\d)? KiB \d+s ago", final), final
    assert "1 restart (last: " in final and "rank 1" in final, final
    assert re.search(r"goodput \d+\.\d%$", final), final
    # Lines printed during training show the steps reached so far.
    assert any(re.search(r"report [1-3] step=[0-2] ", line) for line in status[:-1]), status


def test_level_2_prints_a_line_per_event(
    run_config: Callable[..., cairn.RunConfig], tmp_path: Path, short_interval: None,
    capfd: pytest.CaptureFixture[str],
) -> None:
    marker = str(tmp_path / "crashed")
    result = _fit(run_config, {"steps": 3, "crash_marker": marker, "crash_after": 1,
                      "validation": True}, progress=2, validation=True)
    lines = _view_lines(capfd.readouterr().err)
    events = [line for line in lines if " | uploads: " not in line]
    text = "\n".join(events)
    assert re.search(r"^cairn: committed checkpoint_000001 \(report 1, \d+(\.\d)? KiB, ",
                     text, re.M), text
    assert re.search(r"^cairn: attempt 0 failed: .*rank 1", text, re.M), text
    assert re.search(r"^cairn: restart 1: attempt 1 starts from checkpoint_00000[12] "
                     r"\(after: ", text, re.M), text
    assert result.checkpoint is not None
    last = result.checkpoint.path.rstrip("/").rsplit("/", 1)[-1]
    assert re.search(rf"^cairn: validation of {last} \(report \d+\) finished: VALIDATED$",
                     text, re.M), text
    committed = re.findall(r"^cairn: committed (checkpoint_\d+) ", text, re.M)
    assert len(committed) == len(set(committed)) == 3, text
    assert _status_lines("\n".join(lines)), "the final status line is missing"


def test_level_0_prints_nothing_of_its_own(
    run_config: Callable[..., cairn.RunConfig], tmp_path: Path, short_interval: None,
    capfd: pytest.CaptureFixture[str],
) -> None:
    marker = str(tmp_path / "crashed")
    _fit(run_config, {"steps": 3, "sleep_s": 0.2, "crash_marker": marker,
                      "crash_after": 0}, progress=0)
    captured = capfd.readouterr()
    assert _view_lines(captured.err) == []
    assert _view_lines(captured.out) == []
    # Worker output still reaches the driver.
    assert "(rank 0) rank 0 says goodbye" in captured.out


def test_the_environment_picks_the_level(
    run_config: Callable[..., cairn.RunConfig], short_interval: None,
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("CAIRN_PROGRESS", "1")
    _fit(run_config, {"steps": 1}, progress=None)
    assert _status_lines(capfd.readouterr().err)


@pytest.mark.parametrize(("name", "value", "accepted"), [
    ("CAIRN_PROGRESS", "loud", "use 0 (no live view), 1 (a status line) or 2"),
    ("CAIRN_PROGRESS_INTERVAL", "-1", "use a number of seconds greater than 0"),
])
def test_a_bad_environment_value_fails_fit_before_any_worker_starts(
    run_config: Callable[..., cairn.RunConfig], monkeypatch: pytest.MonkeyPatch,
    name: str, value: str, accepted: str,
) -> None:
    monkeypatch.setenv("CAIRN_PROGRESS", "1")
    monkeypatch.setenv(name, value)
    with pytest.raises(cairn.ConfigError, match=re.escape(f"{name}={value!r} is not accepted: "
                                                          f"{accepted}")):
        _fit(run_config, {"steps": 1}, progress=None)
