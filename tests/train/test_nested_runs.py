"""Where ``fit()`` creates a run directory on local storage: never inside another run's
directory, where that run's retention and ``cairn prune`` would delete it; and under a
``SubTreeFileSystem`` whose base path is relative, from the first ``fit()`` on."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow.fs as pafs
import pytest

import cairn
from cairn import Checkpoint, ConfigError, RunConfig, ScalingConfig, Trainer


def _train(config: dict[str, str]) -> None:
    source = config.get("source")
    cairn.report({"step": 1},
                 checkpoint=Checkpoint.from_directory(source) if source else None)


def _fit(storage_path: str | Path, name: str, *, source: Path | None = None,
         workers: int = 0, filesystem: pafs.FileSystem | None = None) -> cairn.Result:
    return Trainer(_train, train_loop_config={"source": str(source)} if source else {},
                   scaling_config=ScalingConfig(num_workers=workers),
                   run_config=RunConfig(name=name, storage_path=str(storage_path),
                                        storage_filesystem=filesystem, progress=0)).fit()


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """A checkpoint of one file, outside the storage path."""
    directory = tmp_path / "source"
    directory.mkdir()
    (directory / "weights").write_text("1")
    return directory


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_a_run_inside_another_runs_checkpoint_is_refused_before_it_writes(
        tmp_path: Path, source: Path) -> None:
    runs = tmp_path / "runs"
    outer = _fit(runs, "outer", source=source)
    assert outer.checkpoint is not None
    inside = Path(outer.checkpoint.path)
    before = _tree(runs)
    with pytest.raises(ConfigError, match=re.escape(
            f"RunConfig(storage_path='{inside}', name='inner') puts the run directory "
            f"'{inside / 'inner'}' inside the run at '{runs / 'outer'}' (it holds "
            "cairn_run.json): that run's retention and `cairn prune` delete its checkpoint "
            "directories with everything in them. Pass a storage_path outside every run "
            f"directory, such as '{runs}' (where that run lies), with a name of this "
            "run's own.")):
        _fit(inside, "inner", source=source)
    assert _tree(runs) == before


def test_a_run_named_like_an_entry_of_another_run_is_refused(
        tmp_path: Path, source: Path) -> None:
    runs = tmp_path / "runs"
    _fit(runs, "outer", source=source)
    before = _tree(runs)
    with pytest.raises(ConfigError, match=re.escape(
            f"name='metrics') puts the run directory '{runs / 'outer' / 'metrics'}' "
            f"inside the run at '{runs / 'outer'}'")):
        _fit(runs / "outer", "metrics", source=source)
    assert _tree(runs) == before


def test_a_symbolic_link_into_a_run_is_refused(tmp_path: Path, source: Path) -> None:
    runs = tmp_path / "runs"
    outer = _fit(runs, "outer", source=source)
    assert outer.checkpoint is not None
    link = tmp_path / "link"
    link.symlink_to(outer.checkpoint.path, target_is_directory=True)
    before = _tree(runs)
    with pytest.raises(ConfigError, match=re.escape(
            f"inside the run at '{runs / 'outer'}'")):
        _fit(link, "inner", source=source)
    assert _tree(runs) == before


def test_the_storage_path_the_error_suggests_holds_a_run_beside_the_other(
        tmp_path: Path, source: Path) -> None:
    runs = tmp_path / "runs"
    _fit(runs, "outer", source=source)
    beside = _fit(runs, "beside", source=source)
    again = _fit(runs, "outer", source=source)  # a run continued in place is no nested run
    assert beside.path == str(runs / "beside")
    assert again.checkpoint is not None
    assert again.checkpoint.path == str(runs / "outer" / "checkpoint_000002")


def test_a_subtree_filesystem_with_a_relative_base_holds_a_run_from_the_first_fit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    filesystem = pafs.SubTreeFileSystem("rel/dir", pafs.LocalFileSystem())
    result = _fit("runs", "first", workers=1, filesystem=filesystem)
    assert result.metrics == {"step": 1}
    assert (tmp_path / "rel" / "dir" / "runs" / "first" / "cairn_run.json").is_file()
