"""A storage_path that cannot hold runs is refused naming storage_path (issue 25 item 8)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import cairn
from cairn import ConfigError, RunConfig, Trainer


def _train() -> None:
    cairn.report({"x": 1})


@pytest.mark.parametrize(("given", "meant"), [
    ("s3//bucket/runs", "s3://bucket/runs"),
    ("gs//bucket/runs", "gs://bucket/runs"),
    ("memory//runs", "memory://runs"),
    ("file//tmp/runs", "file:///tmp/runs"),
])
def test_a_scheme_without_its_colon_gets_did_you_mean(
        given: str, meant: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=(
            rf"^RunConfig\.storage_path='{given}' is not a valid URI: a scheme is followed "
            rf"by '://'; did you mean '{meant}'\?")):
        Trainer(_train, run_config=RunConfig(storage_path=given))
    assert os.listdir(tmp_path) == []


def test_a_directory_whose_name_is_no_scheme_stays_a_local_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    trainer = Trainer(_train, run_config=RunConfig(storage_path="runs//today"))
    assert trainer._storage_path == str(tmp_path / "runs" / "today")


def test_an_empty_storage_path_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^RunConfig\.storage_path='' is empty; pass a "
                                          r"directory or a URI .* or leave it out \(None\)"):
        RunConfig(storage_path="")


def test_a_storage_path_under_proc_is_refused_by_fit() -> None:
    trainer = Trainer(_train, run_config=RunConfig(storage_path="/proc/x", progress=0))
    with pytest.raises(ConfigError, match=(
            r"^RunConfig\.storage_path='/proc/x' cannot hold runs: the run directory "
            r"'/proc/x/[^']+' cannot be created or written to \(No such file or directory\)"
            r"\. Pass a directory this process can create and write to")):
        trainer.fit()


def test_a_storage_path_under_a_file_is_refused_by_fit(tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    trainer = Trainer(_train, run_config=RunConfig(storage_path=str(blocker / "runs"),
                                                   progress=0))
    with pytest.raises(ConfigError, match=r"cannot be created or written to \(Not a "
                                          r"directory\)"):
        trainer.fit()


def test_a_failed_storage_path_leaves_no_directory_it_created(tmp_path: Path) -> None:
    # The parent is created, then the run directory's over-long name fails.
    storage = tmp_path / "new_parent" / ("x" * 300)
    trainer = Trainer(_train, run_config=RunConfig(storage_path=str(storage), progress=0))
    with pytest.raises(ConfigError, match=r"\(File name too long\)"):
        trainer.fit()
    assert os.listdir(tmp_path) == []
