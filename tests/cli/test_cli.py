"""The ``cairn`` command line against a real run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import cli_workloads
import pytest

import cairn
from cairn._src.cli.main import main
from cairn._src.cli.plots import sparkline


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> str:
    storage = tmp_path_factory.mktemp("cli") / "storage"
    cairn.Trainer(cli_workloads.train, train_loop_config={"steps": 5},
                  run_config=cairn.RunConfig(name="run", storage_path=str(storage))).fit()
    return str(storage / "run")


def test_inspect(run: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", run]) == 0
    out = capsys.readouterr().out
    assert "attempts   1 attempt in 1 driver session, 0 failures" in out
    assert "next report 6" in out
    assert "checkpoint_000005" in out and "loss=0.2" in out
    assert main(["inspect", run, "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["checkpoints"]) == 5


def test_verify_reports_a_corrupt_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cairn.Trainer(cli_workloads.train, train_loop_config={"steps": 2},
                  run_config=cairn.RunConfig(name="v", storage_path=str(tmp_path))).fit()
    run = str(tmp_path / "v")
    assert main(["verify", run]) == 0
    assert "2 verified, 0 failed" in capsys.readouterr().out
    Path(run, "checkpoint_000001", "state.txt").write_text("9")
    assert main(["verify", run]) == 1
    assert "FAILED  checkpoint_000001" in capsys.readouterr().out


def test_prune_dry_run_then_for_real(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cairn.Trainer(cli_workloads.train, train_loop_config={"steps": 4},
                  run_config=cairn.RunConfig(name="p", storage_path=str(tmp_path))).fit()
    run = str(tmp_path / "p")
    assert main(["prune", run, "--keep", "1", "--score", "loss", "--order", "max",
                 "--dry-run"]) == 0
    assert "would drop checkpoint_000002" in capsys.readouterr().out
    assert len([n for n in os.listdir(run) if n.startswith("checkpoint_")]) == 4
    assert main(["prune", run, "--keep", "1", "--score", "loss", "--order", "max"]) == 0
    # The best by loss (max: step 0) and the latest are kept.
    assert sorted(n for n in os.listdir(run) if n.startswith("checkpoint_")) == [
        "checkpoint_000001", "checkpoint_000004"]
    assert main(["verify", run]) == 0


def test_plot_and_goodput(run: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plot", run, "--metric", "loss"]) == 0
    out = capsys.readouterr().out
    assert "loss: 5 reports, first 1, last 0.2" in out
    assert main(["goodput", run, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["attempts"] == 1.0


def test_bad_input_errors(run: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plot", run, "--metric", "accuracy"]) == 2
    assert "--metric='accuracy' is not a numeric metric of this run; metrics: ['loss', 'step']" \
        in capsys.readouterr().err
    assert main(["inspect", str(tmp_path)]) == 2
    assert "is not a Cairn run directory" in capsys.readouterr().err
    assert main(["verify", run, "--checkpoint", "nope"]) == 2
    assert "--checkpoint ['nope'] not in the run" in capsys.readouterr().err
    assert main(["prune", run, "--keep", "0"]) == 2
    assert "--keep=0 must be an integer >= 1" in capsys.readouterr().err


def test_sparkline() -> None:
    assert sparkline([0.0, 1.0]) == "▁█"
    # The lowest value is drawn, not a blank as a gap is: a constant metric shows a line.
    assert sparkline([0.5, 0.5, 0.5]) == "▁▁▁"
    assert sparkline([0.0, float("nan"), 1.0]) == "▁ █"
    assert len(sparkline(list(map(float, range(1000))), width=10)) == 10


def test_console_script(run: str) -> None:
    done = subprocess.run([os.path.join(os.path.dirname(sys.executable), "cairn"),
                           "goodput", run], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "goodput" in done.stdout
