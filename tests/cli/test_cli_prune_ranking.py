"""How ``cairn prune`` ranks (issue 25, item 1): by the run's own score attribute and order
unless told otherwise, and never by a guessed order.

The run ranks by ``loss`` (min), ``loss = 1 / (step + 1)``: the lower, the later, so the
best two of five checkpoints are the last two."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import cli_workloads
import pytest

import cairn
from cairn._src.cli.main import main

BY_LOSS_MIN = cairn.CheckpointConfig(checkpoint_score_attribute="loss",
                                     checkpoint_score_order="min")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    storage = tmp_path_factory.mktemp("ranking") / "storage"
    cairn.Trainer(cli_workloads.train, train_loop_config={"steps": 5},
                  run_config=cairn.RunConfig(name="run", storage_path=str(storage),
                                             checkpoint_config=BY_LOSS_MIN)).fit()
    return storage / "run"


def prune_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    capsys.readouterr()
    assert main(["prune", *args, "--json"]) == 0
    document: dict[str, object] = json.loads(capsys.readouterr().out)
    return document


def kept(document: dict[str, object]) -> list[str]:
    return [k["dir_name"] for k in document["kept"]]  # type: ignore[attr-defined,index]


def test_the_runs_score_attribute_takes_the_runs_order(
        pristine: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    shutil.copytree(pristine, run)
    assert main(["prune", str(run), "--keep", "2", "--score", "loss"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ranking by loss (min), the run's own checkpoint_score_order\n")
    assert "keeping    checkpoint_000004: #2 of the best 2 by loss (min)" in out
    # The best two by loss are kept; the three worst are deleted.
    assert sorted(n for n in os.listdir(run) if n.startswith("checkpoint_")) == [
        "checkpoint_000004", "checkpoint_000005"]


def test_keep_without_score_ranks_as_the_run_does(
        pristine: Path, capsys: pytest.CaptureFixture[str]) -> None:
    document = prune_json(capsys, str(pristine), "--keep", "2", "--dry-run")
    assert (document["score"], document["order"]) == ("loss", "min")
    assert kept(document) == ["checkpoint_000004", "checkpoint_000005"]
    assert main(["prune", str(pristine), "--keep", "2", "--dry-run"]) == 0
    assert capsys.readouterr().out.startswith(
        "ranking by loss (min), the run's own checkpoint_score_attribute and "
        "checkpoint_score_order (--score and --order choose another)\n")
    # An explicit order still wins.
    document = prune_json(capsys, str(pristine), "--keep", "2", "--score", "loss",
                          "--order", "max", "--dry-run")
    assert kept(document) == ["checkpoint_000001", "checkpoint_000002", "checkpoint_000005"]


def test_another_metric_needs_an_order(
        pristine: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["prune", str(pristine), "--keep", "2", "--score", "step", "--dry-run"]) == 2
    assert ("error: --score='step' needs --order max or --order min (the run ranks by loss "
            "(min), so no order is known for step): pass --order max to keep the highest "
            "step, --order min to keep the lowest.") in capsys.readouterr().err
    document = prune_json(capsys, str(pristine), "--keep", "2", "--score", "step",
                          "--order", "max", "--dry-run")
    assert kept(document) == ["checkpoint_000004", "checkpoint_000005"]
    assert main(["prune", str(pristine), "--keep", "2", "--order", "min", "--dry-run"]) == 2
    assert "error: --order=min needs --score METRIC" in capsys.readouterr().err


def test_a_run_without_a_score_keeps_the_latest_and_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cairn.Trainer(cli_workloads.train, train_loop_config={"steps": 3},
                  run_config=cairn.RunConfig(name="r", storage_path=str(tmp_path))).fit()
    run = str(tmp_path / "r")
    assert main(["prune", run, "--keep", "1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("keeping the latest 1 (the run ranks by no score: no "
                          "checkpoint_score_attribute recorded)\n")
    assert "would keep checkpoint_000003: #1 of the latest 1; the latest checkpoint" in out
    assert main(["prune", run, "--keep", "1", "--score", "loss", "--dry-run"]) == 2
    assert ("--score='loss' needs --order max or --order min (the run recorded no "
            "checkpoint_score_attribute, so no order is known for loss)"
            ) in capsys.readouterr().err


def test_prune_ranking_errors_name_the_argument() -> None:
    import argparse

    from cairn._src.checkpoint.index import Retention, RunIndex
    from cairn._src.cli.runs import prune_ranking
    from cairn._src.errors import CairnError

    index = RunIndex(retention=Retention(2, "loss", "min"))
    with pytest.raises(CairnError, match=r"^--order=max needs --score METRIC"):
        prune_ranking(argparse.Namespace(keep=1, score=None, order="max", latest=False), index)
    with pytest.raises(CairnError, match=r"^--score='acc' is not a metric of this run's "
                                         r"checkpoints; they have: no metrics\.$"):
        prune_ranking(argparse.Namespace(keep=1, score="acc", order=None, latest=False), index)
    assert prune_ranking(argparse.Namespace(keep=1, score=None, order=None, latest=False),
                         index)[:2] == ("loss", "min")
    with pytest.raises(CairnError, match=r"^The run's index records no ranking .* pass "
                                         r"--score METRIC with --order max or min, or "
                                         r"--latest to keep the latest N; nothing changed\.$"):
        prune_ranking(argparse.Namespace(keep=1, score=None, order=None, latest=False),
                      RunIndex())
    assert prune_ranking(argparse.Namespace(keep=1, score=None, order=None, latest=True),
                         RunIndex())[:2] == (None, "max")
    with pytest.raises(CairnError, match=r"^--latest keeps the latest N and ranks by no "
                                         r"metric: pass it without --score and --order\.$"):
        prune_ranking(argparse.Namespace(keep=1, score="loss", order=None, latest=True), index)


def test_after_rebuild_index_prune_asks_how_to_rank_instead_of_keeping_the_latest(
        pristine: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A flaky disk damaged the index; the rebuilt one cannot know the run ranked by loss
    # (min), whose best checkpoint is not the latest here.
    run = tmp_path / "run"
    shutil.copytree(pristine, run)
    (run / "cairn_run.json").write_bytes(b"{damaged")
    assert main(["rebuild-index", str(run)]) == 0
    names = sorted(n for n in os.listdir(run) if n.startswith("checkpoint_"))
    capsys.readouterr()
    assert main(["prune", str(run), "--keep", "2"]) == 2
    assert "error: The run's index records no ranking" in capsys.readouterr().err
    assert sorted(n for n in os.listdir(run) if n.startswith("checkpoint_")) == names
    document = prune_json(capsys, str(run), "--keep", "2", "--score", "loss", "--order",
                          "min", "--dry-run")
    assert kept(document) == ["checkpoint_000004", "checkpoint_000005"]
    document = prune_json(capsys, str(run), "--keep", "2", "--latest", "--dry-run")
    assert kept(document) == ["checkpoint_000004", "checkpoint_000005"]


def test_score_reaches_into_nested_metrics_as_retention_does(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The run ranks by val/loss (min), reported as {"val": {"loss": ...}}.
    cairn.Trainer(cli_workloads.nested_metrics, run_config=cairn.RunConfig(
        name="n", storage_path=str(tmp_path), checkpoint_config=cairn.CheckpointConfig(
            checkpoint_score_attribute="val/loss", checkpoint_score_order="min"))).fit()
    run = str(tmp_path / "n")
    # Best two by val/loss: steps 1 (0.2) and 3 (0.3); the latest stays too.
    best = ["checkpoint_000002", "checkpoint_000004", "checkpoint_000005"]
    document = prune_json(capsys, run, "--keep", "2", "--score", "val/loss", "--order", "min",
                          "--dry-run")
    assert (document["score"], document["order"]) == ("val/loss", "min")
    assert kept(document) == best
    assert main(["prune", run, "--keep", "2", "--score", "val/loss", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ranking by val/loss (min), the run's own checkpoint_score_order\n")
    assert "would keep checkpoint_000002: #1 of the best 2 by val/loss (min)" in out
    document = prune_json(capsys, run, "--keep", "1", "--score", "val/acc", "--order", "max",
                          "--dry-run")
    assert kept(document) == ["checkpoint_000002", "checkpoint_000005"]
    # A metric the run lacks: the error lists the nested ones by their paths.
    assert main(["prune", run, "--keep", "2", "--score", "val/los", "--order", "min"]) == 2
    assert ("error: --score='val/los' is not a metric of this run's checkpoints; they have: "
            "step, val/acc, val/loss.") in capsys.readouterr().err
    assert main(["prune", run, "--keep", "2", "--score", "loss"]) == 2
    assert "they have: step, val/acc, val/loss." in capsys.readouterr().err
    # Not a dry run: the two best and the latest stay on storage.
    assert main(["prune", run, "--keep", "2", "--score", "val/loss"]) == 0
    assert sorted(n for n in os.listdir(run) if n.startswith("checkpoint_")) == best


def test_the_metrics_a_score_error_lists_are_bounded() -> None:
    import argparse

    from cairn._src.checkpoint.index import CheckpointRecord, Retention, RunIndex
    from cairn._src.cli.runs import NESTED_DEPTH, SHOWN_METRICS, metric_paths, prune_ranking
    from cairn._src.errors import CairnError

    deep: dict[str, object] = {"leaf": 1.0}
    for level in range(10):
        deep = {f"l{level}": deep}
    metrics = {**{f"m{i:02d}": float(i) for i in range(30)}, "deep": deep, "empty": {}}
    index = RunIndex(checkpoints=(CheckpointRecord(dir_name="checkpoint_000001",
                                                   report_index=1, metrics=metrics),),
                     retention=Retention(2, "m00", "min"))
    paths = metric_paths(index.checkpoints)
    assert "deep/l9/l8/l7" in paths and max(p.count("/") for p in paths) == NESTED_DEPTH - 1
    assert "empty" in paths and len(paths) == 32
    with pytest.raises(CairnError, match=rf"they have: deep/l9/l8/l7, empty, m00, .*, m17, "
                                         rf"\.\.\. \({32 - SHOWN_METRICS} more\)\.$"):
        prune_ranking(argparse.Namespace(keep=1, score="acc", order="max", latest=False), index)
