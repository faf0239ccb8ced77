"""Run identity: unique default names, one start line, an absolute storage path, and URI
typos refused with the corrected URI."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import pytest

import cairn
from cairn._src.storage.location import resolve


def _two_reports() -> None:
    for step in range(2):
        cairn.report({"step": step})


def _checkpointed(config: dict[str, str]) -> None:
    for step in range(2):
        directory = os.path.join(config["scratch"], f"{cairn.get_context().get_attempt()}_"
                                 f"{cairn.get_context().get_world_rank()}_{step}")
        os.makedirs(directory)
        cairn.report({"step": step}, cairn.Checkpoint.from_directory(directory))


def test_trainers_built_in_a_loop_never_share_a_run(tmp_path: Path) -> None:
    storage = str(tmp_path / "runs")
    trainers = [cairn.Trainer(_two_reports,
                              run_config=cairn.RunConfig(storage_path=storage))
                for _ in range(3)]
    names = [trainer._run_name for trainer in trainers]
    assert len(set(names)) == 3
    for name in names:
        assert re.fullmatch(r"cairn_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_[0-9a-f]{6}", name)
    results = [trainer.fit() for trainer in trainers[:2]]
    # Each is a new run: report numbering starts at 1 in each, nothing continued.
    for result in results:
        assert result.metrics_dataframe["report_index"].tolist() == [1, 2]
        assert result.goodput.attempts == 1
    assert sorted(os.listdir(storage)) == sorted(names[:2])


def test_fit_logs_a_new_run_then_where_it_continues(
    tmp_path: Path, scratch: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = cairn.RunConfig(name="exp", storage_path="relative/runs")
    trainer = cairn.Trainer(_checkpointed, train_loop_config={"scratch": scratch},
                            run_config=config)
    # Made absolute once: a later chdir does not move the run.
    monkeypatch.chdir(scratch)
    absolute = str(tmp_path / "relative" / "runs" / "exp")
    with caplog.at_level(logging.INFO, logger="cairn"):
        trainer.fit()
    starts = [r.getMessage() for r in caplog.records if "run 'exp'" in r.getMessage()]
    assert starts == [f"Starting new run 'exp' at {absolute}"]
    assert os.path.isdir(absolute)

    caplog.clear()
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.INFO, logger="cairn"):
        cairn.Trainer(_checkpointed, train_loop_config={"scratch": scratch},
                      run_config=config).fit()
    starts = [r.getMessage() for r in caplog.records if "run 'exp'" in r.getMessage()]
    assert starts == [f"Continuing run 'exp' at {absolute} from checkpoint checkpoint_000002 "
                      "(report 2)"]


@pytest.mark.parametrize(
    ("typo", "corrected"),
    [
        ("s3:/bucket/x", "s3://bucket/x"),
        ("s3:bucket/x", "s3://bucket/x"),
        ("s3:bucket", "s3://bucket"),
        ("gs:bucket", "gs://bucket"),
        ("gs:/bucket/runs", "gs://bucket/runs"),
        ("gcs:/b", "gcs://b"),
        ("hdfs:/x", "hdfs://x"),
        ("file:/x", "file:///x"),
        ("file:x/y", "file:///x/y"),
        ("memory:/runs", "memory://runs"),
        ("az:/container/p", "az://container/p"),
        ("S3:/Bucket/x", "S3://Bucket/x"),
    ],
)
def test_uri_typos_are_refused_with_the_corrected_uri(typo: str, corrected: str) -> None:
    message = (rf"location='{re.escape(typo)}' is not a valid URI: a scheme is followed by "
               rf"'://'; did you mean '{re.escape(corrected)}'\?")
    with pytest.raises(cairn.ConfigError, match=message):
        resolve(typo)
    with pytest.raises(cairn.ConfigError, match=message):
        cairn.Checkpoint(typo)
    with pytest.raises(cairn.ConfigError,
                       match=rf"RunConfig.storage_path='{re.escape(typo)}' is not a valid URI.*"
                             rf"did you mean '{re.escape(corrected)}'\?"):
        cairn.Trainer(_two_reports, run_config=cairn.RunConfig(storage_path=typo))


def test_registered_schemes_are_known_to_the_typo_check(dict_store: object) -> None:
    with pytest.raises(cairn.ConfigError, match=r"did you mean 'dictstore://a/b'\?"):
        resolve("dictstore:/a/b")


def test_local_paths_with_colons_keep_working(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for given in ("./a:b", "a:b", "notascheme:/x", "./s3:/bucket"):
        location = resolve(given)
        assert location.path == os.path.abspath(given)
    result = cairn.Trainer(_two_reports, run_config=cairn.RunConfig(
        name="r", storage_path="./runs:colon")).fit()
    assert result.path == str(tmp_path / "runs:colon" / "r")
