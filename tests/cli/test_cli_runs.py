"""The ``cairn`` command for people: version, ``python -m cairn``, help, closed pipes."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import cairn
from cairn._src.cli.main import build_parser, main


def test_version_prints_the_distribution_version() -> None:
    out = subprocess.run([sys.executable, "-m", "cairn", "--version"], capture_output=True,
                         text=True, check=True).stdout
    assert out.startswith("cairn ")
    from importlib import metadata

    try:
        expected = metadata.version("cairn-train")
    except metadata.PackageNotFoundError:
        expected = cairn.__version__
    assert out.split() == ["cairn", expected]


def test_every_option_of_every_subcommand_has_help() -> None:
    def walk(parser: argparse.ArgumentParser, where: str) -> list[str]:
        missing = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    if name in ("plot", "goodput"):
                        continue  # cairn._src.cli.plots: checked with that module
                    missing += walk(sub, f"{where} {name}")
            elif not action.help:
                missing.append(f"{where}: {action.option_strings or action.dest}")
        return missing

    assert walk(build_parser(), "cairn") == []


def test_a_closed_pipe_gives_no_traceback() -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before cairn writes a byte
    proc = subprocess.run([sys.executable, "-m", "cairn", "--help"], stdout=write_end,
                          stderr=subprocess.PIPE, text=True)
    os.close(write_end)
    assert "Traceback" not in proc.stderr
    assert proc.returncode in (0, 141)


def test_main_is_importable_as_a_function() -> None:
    assert callable(main)


def test_rebuild_index_refuses_a_path_that_holds_no_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("x")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    assert main(["rebuild-index", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "holds no run" in err and "nothing written" in err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before
    assert main(["rebuild-index", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_prune_refuses_a_metric_the_run_lacks_and_guesses_no_order(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import cli_workloads

    cairn.Trainer(cli_workloads.train, train_loop_config={"steps": 3},
                  run_config=cairn.RunConfig(name="p", storage_path=str(tmp_path))).fit()
    run = str(tmp_path / "p")
    assert main(["prune", run, "--keep", "1", "--score", "acc", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "--score='acc'" in err and "loss, step" in err
    # The run records no score attribute: no order is guessed for loss.
    assert main(["prune", run, "--keep", "1", "--score", "loss", "--dry-run"]) == 2
    assert "--score='loss' needs --order max or --order min" in capsys.readouterr().err
    assert main(["prune", run, "--keep", "1", "--score", "loss", "--order", "min",
                 "--dry-run"]) == 0
    assert capsys.readouterr().out.startswith("ranking by loss (min)\n")


def _failing(config: dict[str, object]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        cairn.report({"step": 0}, checkpoint=cairn.Checkpoint.from_directory(tmp))
    if cairn.get_context().get_world_rank() == 1:
        raise ValueError("rank one gives up")


def test_ls_lists_runs_newest_first_and_skips_what_is_not_a_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import cli_workloads

    storage = tmp_path / "storage"
    cairn.Trainer(cli_workloads.train, train_loop_config={"steps": 2},
                  run_config=cairn.RunConfig(name="done", storage_path=str(storage))).fit()
    with pytest.raises(cairn.WorkerGroupError):
        cairn.Trainer(_failing, scaling_config=cairn.ScalingConfig(num_workers=2),
                      run_config=cairn.RunConfig(
                          name="broke", storage_path=str(storage),
                          failure_config=cairn.FailureConfig(max_failures=0))).fit()
    (storage / "notes").mkdir()
    (storage / "bad").mkdir()
    (storage / "bad" / "cairn_run.json").write_text("{not json")
    assert main(["ls", str(storage), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    by_name = {r["name"]: r for r in data["runs"]}
    assert set(by_name) == {"done", "broke", "bad"}
    assert by_name["done"]["status"] == "finished"
    assert by_name["done"]["attempts"] == 1 and by_name["done"]["failures"] == 0
    assert by_name["done"]["last_report"] == 2
    assert isinstance(by_name["done"]["size_bytes"], int) and by_name["done"]["size_bytes"] > 0
    assert by_name["broke"]["status"] == "failed" and by_name["broke"]["failures"] == 1
    assert by_name["bad"]["status"] == "unreadable" and by_name["bad"]["reason"]
    assert [r["name"] for r in data["runs"]][:2] == ["broke", "done"]
    assert main(["ls", str(storage)]) == 0
    out = capsys.readouterr().out
    assert "finished" in out and "failed" in out and "unreadable" in out
    assert "Traceback" not in out
    (tmp_path / "empty").mkdir()
    assert main(["ls", str(tmp_path / "empty")]) == 0
    assert "no runs under" in capsys.readouterr().out
    assert main(["ls", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    error = cairn.Result.from_path(str(storage / "broke")).error
    assert isinstance(error, cairn.RunFailedError)
    assert isinstance(error.error_type, str) and error.error_type
    assert error.rank == 1
    assert "ValueError" in str(error) and "rank one gives up" in str(error)
    assert cairn.Result.from_path(str(storage / "done")).error is None


def test_show_is_an_alias_of_inspect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import cli_workloads

    cairn.Trainer(cli_workloads.train, train_loop_config={"steps": 2},
                  run_config=cairn.RunConfig(name="r", storage_path=str(tmp_path))).fit()
    assert main(["show", str(tmp_path / "r")]) == 0
    shown = capsys.readouterr().out
    assert main(["inspect", str(tmp_path / "r")]) == 0
    assert capsys.readouterr().out == shown


def test_rebuild_index_and_lease_break_json(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import cli_workloads

    cairn.Trainer(cli_workloads.train, train_loop_config={"steps": 2},
                  run_config=cairn.RunConfig(name="r", storage_path=str(tmp_path))).fit()
    run = str(tmp_path / "r")
    assert main(["rebuild-index", run, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["checkpoints"] == 2 and type(data["checkpoints"]) is int
    assert main(["lease", "break", run, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["run"]
