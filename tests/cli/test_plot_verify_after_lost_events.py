"""``cairn plot`` and ``cairn verify`` over real runs whose event log lacks what a driver
killed with ``kill -9`` had not flushed yet, and whose metrics diverged to ±1.8e308.

The event log is flushed about once a second, so a driver killed with ``kill -9`` loses its
last ``commit`` events while the index it wrote names those checkpoints. Whether a real
kill lands inside that second is up to timing: the test takes every ``commit`` event out of
the first driver's log instead, as such a kill would have, then a second driver resumes
(dropping the damaged latest checkpoint) and retention deletes the rest."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cli_workloads
import doc_schema
import plot_workloads
import pytest

import cairn
from cairn._src.cli.main import main
from cairn._src.run.layout import EVENTS_DIR

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Runs:
    lost: str  # commit events lost, checkpoint_000003 dropped as damaged on resume
    huge: str  # a metric of ±1.8e308


def fit(storage: Path, name: str, steps: int) -> None:
    cairn.Trainer(cli_workloads.train, train_loop_config={"steps": steps},
                  run_config=cairn.RunConfig(
                      name=name, storage_path=str(storage),
                      checkpoint_config=cairn.CheckpointConfig(num_to_keep=2))).fit()


def drop_commit_events(run: Path) -> None:
    for segment in (run / EVENTS_DIR).glob("segment_*.jsonl"):
        lines = segment.read_text().splitlines(keepends=True)
        segment.write_text("".join(line for line in lines
                                   if json.loads(line).get("type") != "commit"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    storage = tmp_path_factory.mktemp("lost_events")
    fit(storage, "lost", 3)  # commits 1-3, retention deletes 1
    drop_commit_events(storage / "lost")
    (storage / "lost" / "checkpoint_000003" / "state.txt").write_text("damaged")
    fit(storage, "lost", 2)  # drops 3, resumes from 2, commits 4 and 5, deletes 2
    cairn.Trainer(plot_workloads.diverge,
                  run_config=cairn.RunConfig(name="huge", storage_path=str(storage))).fit()
    yield Runs(str(storage / "lost"), str(storage / "huge"))


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def plot_json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    code, out, err = cli(capsys, "plot", *args, "--json")
    assert code == 0, err
    return json.loads(out)


def test_plot_counts_checkpoints_committed_whose_commit_event_was_lost(
        runs: Runs, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    events = [json.loads(line) for segment in sorted(Path(runs.lost, EVENTS_DIR).iterdir())
              for line in segment.read_text().splitlines()]
    assert not [e for e in events if e["type"] == "commit" and e["index"] <= 3]
    document = plot_json(capsys, runs.lost, "--metric", "loss")
    assert [(c["dir_name"], c["attempt"], c["status"]) for c in document["checkpoints"]] == [
        ("checkpoint_000001", 0, "deleted"), ("checkpoint_000002", 0, "deleted"),
        ("checkpoint_000003", 0, "deleted"),  # dropped as damaged
        ("checkpoint_000004", 1, "kept"), ("checkpoint_000005", 1, "kept")]
    code, _, err = cli(capsys, "plot", runs.lost, "--metric", "loss", "-o",
                       str(tmp_path / "lost.png"))
    assert code == 0 and (tmp_path / "lost.png").stat().st_size > 0, err


def test_verify_names_a_checkpoint_dropped_as_damaged(
        runs: Runs, capsys: pytest.CaptureFixture[str]) -> None:
    full_code, full, _ = cli(capsys, "verify", runs.lost)
    [line] = [line for line in full.splitlines() if line.startswith("DROPPED")]
    assert line.startswith("DROPPED checkpoint_000003: damaged")
    code, out, err = cli(capsys, "verify", runs.lost, "--checkpoint", "checkpoint_000003")
    assert (code, out.splitlines()) == (full_code, [line, "0 verified, 0 failed, 1 dropped "
                                                          "as damaged"]) and code == 1, err
    code, out, _ = cli(capsys, "verify", runs.lost, "--checkpoint", "checkpoint_000003",
                       "--checkpoint", "checkpoint_000005", "--json")
    document = json.loads(out)
    doc_schema.check(document, "verify")
    assert code == 1 and [(c["dir_name"], c["status"]) for c in document["checkpoints"]] == [
        ("checkpoint_000005", "ok"), ("checkpoint_000003", "dropped")]


def test_verify_refuses_a_name_neither_indexed_nor_dropped(
        runs: Runs, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, "verify", runs.lost, "--checkpoint", "checkpoint_000002",
                       "--checkpoint", "checkpoint_000003")
    assert code == 2 and err.strip() == (
        "cairn verify: error: --checkpoint ['checkpoint_000002'] not in the run; known: "
        "['checkpoint_000003', 'checkpoint_000004', 'checkpoint_000005']")


def test_plot_draws_a_metric_of_the_largest_doubles(
        runs: Runs, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, err = cli(capsys, "plot", runs.huge, "--metric", "g", "--metric", "flat")
    assert code == 0, err
    assert out.splitlines() == [
        "g: 4 reports, first 1, last 2, min -1.798e+308, max 1.798e+308", "▅█▁▅",
        "flat: 4 reports, first 1e+308, last 1e+308, min 1e+308, max 1e+308", "▁▁▁▁"]
    assert plot_json(capsys, runs.huge, "--metric", "g")["series"][0]["y"] == list(
        plot_workloads.HUGE)
    for x_axis in ("report", "step", "time"):
        out_file = tmp_path / f"huge_{x_axis}.png"
        code, _, err = cli(capsys, "plot", runs.huge, "--metric", "g", "--metric", "flat",
                           "--x", x_axis, "-o", str(out_file))
        assert code == 0 and out_file.stat().st_size > 0, err
