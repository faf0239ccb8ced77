"""The paths given to ``Checkpoint``: what is not a usable path is refused with a
:class:`ConfigError` naming ``path`` where the checkpoint is built, and
``to_directory(path)`` writes only into a local directory that is not Cairn's own data."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

import cairn
from cairn import Checkpoint, CheckpointUploadMode
from cairn._src.checkpoint.manifest import MANIFEST_NAME, Manifest, write_manifest
from cairn._src.errors import ConfigError
from cairn._src.storage.location import resolve
from cairn._src.storage.transfer import upload_directory


@pytest.fixture
def source(tmp_path: Path) -> Path:
    root = tmp_path / "source"
    (root / "model").mkdir(parents=True)
    (root / "model" / "weights.bin").write_bytes(b"w" * 100)
    (root / "step.txt").write_bytes(b"7")
    return root


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every entry under ``root``: a file's bytes, None for a directory."""
    out: dict[str, bytes | None] = {}
    for directory, names, files in os.walk(root):
        for name in names:
            out[os.path.relpath(os.path.join(directory, name), root)] = None
        for name in files:
            path = os.path.join(directory, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = f.read()
    return out


def _non_utf8_directory(tmp_path: Path) -> str:
    """A real directory whose name is not UTF-8, as Python names it (with a surrogate)."""
    path = os.fsdecode(os.fsencode(str(tmp_path)) + b"/ck\xff")
    os.mkdir(path)
    with open(os.path.join(path, "f"), "wb") as f:
        f.write(b"1")
    return path


# --- building a checkpoint -------------------------------------------------------------


@pytest.mark.parametrize(("value", "shown"), [
    (None, "path=None) must be the path of a local directory, as a str or os.PathLike"),
    (5, "path=5) must be the path of a local directory, as a str or os.PathLike"),
    (b"/tmp/x", "path=b'/tmp/x') must be the path of a local directory, as a str or os.PathLike"),
    ("", "path='') names no directory"),
    ("  ", "path='  ') names no directory"),
])
def test_from_directory_refuses_what_is_not_a_directory_path(value: Any, shown: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"Checkpoint.from_directory({shown}")):
        Checkpoint.from_directory(value)


def test_a_nul_in_the_path_is_refused_when_the_checkpoint_is_built(tmp_path: Path) -> None:
    where = f"{tmp_path}/ck\0x"
    with pytest.raises(ConfigError, match=re.escape(
            f"Checkpoint.from_directory(path={where!r}): path contains a NUL character")):
        Checkpoint.from_directory(where)
    with pytest.raises(ConfigError, match=re.escape(
            f"Checkpoint(path={where!r}): path contains a NUL character")):
        Checkpoint(where)
    with pytest.raises(ConfigError, match=r"Checkpoint\(path='ck\\x00x'\): .*NUL"):
        Checkpoint("ck\0x", filesystem=resolve(str(tmp_path)).filesystem)


def test_a_path_not_encodable_as_utf8_is_refused_and_shown_escaped(tmp_path: Path) -> None:
    where = _non_utf8_directory(tmp_path)
    for build, call in [(Checkpoint.from_directory, "Checkpoint.from_directory"),
                        (Checkpoint, "Checkpoint")]:
        with pytest.raises(ConfigError) as caught:
            build(where)
        message = str(caught.value)
        assert message.startswith(f"{call}(path={where!r}): path cannot be encoded as UTF-8")
        assert "ck\\udcff" in message
        message.encode("utf-8")  # printable anywhere: the bad byte is escaped


def _report_bad_paths(config: dict[str, Any]) -> list[str]:
    """Reports each bad path in each mode; returns what each report raised."""
    raised = []
    for where in config["paths"]:
        for mode in (CheckpointUploadMode.SYNC, CheckpointUploadMode.NO_UPLOAD):
            try:
                cairn.report({"step": 0}, Checkpoint.from_directory(where),
                             checkpoint_upload_mode=mode)
                raised.append("nothing")
            except Exception as exc:  # the test checks what each report raised
                raised.append(f"{type(exc).__name__}: {exc}")
    cairn.report({"step": 1})
    return raised


def test_a_report_of_a_nul_or_non_utf8_path_gets_a_config_error_and_registers_nothing(
    tmp_path: Path
) -> None:
    paths = [f"{tmp_path}/ck\0x", _non_utf8_directory(tmp_path)]
    storage = tmp_path / "storage"
    result = cairn.Trainer(
        _report_bad_paths, train_loop_config={"paths": paths},
        run_config=cairn.RunConfig(name="run", storage_path=str(storage))).fit()
    assert result.error is None
    raised = result.return_value
    assert len(raised) == 4
    assert all(text.startswith("ConfigError: Checkpoint.from_directory(path=")
               for text in raised), raised
    assert "NUL character" in raised[0] and "NUL character" in raised[1]
    assert "UTF-8" in raised[2] and "UTF-8" in raised[3]
    assert result.checkpoint is None
    assert not [name for name in os.listdir(storage / "run") if name.startswith("checkpoint")]


# --- to_directory: what is not a local directory ---------------------------------------


@pytest.mark.parametrize(("value", "shown"), [
    (5, "path=5) must be the path of a local directory, as a str or os.PathLike"),
    ("", "path='') names no directory"),
    ("out\0x", "path='out\\x00x'): path contains a NUL character"),
    ("memory://x/y", "path='memory://x/y'): path is a URI, but to_directory() copies into "
                     "a local directory"),
    ("s3:/b/x", "path='s3:/b/x'): path looks like the URI 's3://b/x' mistyped"),
    ("s3//b/x", "path='s3//b/x'): path looks like the URI 's3://b/x' mistyped"),
    ("file:/tmp/x", "path='file:/tmp/x'): path looks like the URI 'file:///tmp/x' mistyped"),
])
def test_to_directory_refuses_what_is_not_a_local_directory_and_writes_nothing(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: Any, shown: str
) -> None:
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    with pytest.raises(ConfigError, match=re.escape(f"Checkpoint.to_directory({shown}")):
        Checkpoint.from_directory(source).to_directory(value)
    assert os.listdir(work) == []


def test_to_directory_refuses_a_non_utf8_target(source: Path, tmp_path: Path) -> None:
    target = os.fsdecode(os.fsencode(str(tmp_path)) + b"/out\xff")
    assert repr(target).endswith("out\\udcff'")
    with pytest.raises(ConfigError, match=re.escape(
            f"Checkpoint.to_directory(path={target!r}): path cannot be encoded as UTF-8")):
        Checkpoint.from_directory(source).to_directory(target)
    assert not os.path.lexists(target)


def test_to_directory_refuses_a_file_and_a_path_under_a_file(
    source: Path, tmp_path: Path
) -> None:
    afile = tmp_path / "afile"
    afile.write_bytes(b"mine")
    checkpoint = Checkpoint.from_directory(source)
    with pytest.raises(ConfigError, match=re.escape(
            f"Checkpoint.to_directory(path={str(afile)!r}): path is a file, not a directory")):
        checkpoint.to_directory(afile)
    under = afile / "sub"
    with pytest.raises(ConfigError, match=re.escape(
            f"Checkpoint.to_directory(path={str(under)!r}): the directory {str(under)!r} "
            "cannot be created (Not a directory)")):
        checkpoint.to_directory(under)
    assert afile.read_bytes() == b"mine"


# --- to_directory: Cairn's own data and the checkpoint itself ---------------------------


def test_to_directory_refuses_the_checkpoints_own_directory_and_inside_it(
    source: Path, tmp_path: Path
) -> None:
    before = _tree(source)
    checkpoint = Checkpoint.from_directory(source)
    link = tmp_path / "link"
    link.symlink_to(source / "model", target_is_directory=True)
    for target in [source, source / "model", source / "new", link]:
        with pytest.raises(ConfigError, match=re.escape(
                f"Checkpoint.to_directory(path={str(target)!r}): path is this checkpoint's "
                f"own directory {str(source)!r} or inside it")):
            checkpoint.to_directory(target)
    assert _tree(source) == before


def _two_reports(config: dict[str, Any]) -> None:
    for step in range(2):
        directory = os.path.join(config["scratch"], f"step_{step}")
        os.makedirs(directory)
        with open(os.path.join(directory, "model.bin"), "wb") as f:
            f.write(b"weights %d" % step)
        cairn.report({"step": step}, Checkpoint.from_directory(directory))


def test_to_directory_refuses_a_run_directory_and_a_committed_checkpoint(
    tmp_path: Path, scratch: str
) -> None:
    storage = tmp_path / "storage"
    result = cairn.Trainer(
        _two_reports, train_loop_config={"scratch": scratch},
        run_config=cairn.RunConfig(name="run", storage_path=str(storage))).fit()
    assert result.checkpoint is not None
    run = Path(result.path)
    first = run / "checkpoint_000001"
    link = tmp_path / "into_run"
    link.symlink_to(run, target_is_directory=True)
    before = _tree(run)
    checkpoint = result.checkpoint
    run_dir = re.escape(f"path is the run directory {str(run)!r} or inside it (it holds the "
                        "run index cairn_run.json)")
    for target, expected in [
        (run, run_dir),
        (run / "restored", run_dir),
        (link / "restored", run_dir),
        (first / "sub", re.escape(f"path is the committed checkpoint {str(first)!r} or "
                                  "inside it")),
        (Path(checkpoint.path) / "sub", "path is this checkpoint's own directory"),
    ]:
        with pytest.raises(ConfigError, match=re.escape(
                f"Checkpoint.to_directory(path={str(target)!r}): ") + expected):
            checkpoint.to_directory(target)
    assert _tree(run) == before
    # A committed checkpoint outside any run: its manifest marks it.
    committed = tmp_path / "committed"
    (committed / "data").mkdir(parents=True)
    (committed / "data" / "a.bin").write_bytes(b"a")
    location = resolve(str(committed))
    write_manifest(location, Manifest(files=upload_directory(str(committed), location)))
    before = _tree(committed)
    for target in [committed, committed / "data", committed / "new"]:
        with pytest.raises(ConfigError, match=re.escape(
                f"Checkpoint.to_directory(path={str(target)!r}): path is the committed "
                f"checkpoint {str(committed)!r} or inside it (it holds the manifest "
                f"{MANIFEST_NAME})")):
            checkpoint.to_directory(target)
    assert _tree(committed) == before
    # Outside the run, the copy is made as before.
    out = checkpoint.to_directory(tmp_path / "restored")
    assert _tree(Path(out)) == {"model.bin": b"weights 1"}


# --- to_directory: what Ray users rely on keeps working --------------------------------


def test_to_directory_still_copies_where_ray_train_does(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = _tree(source)
    checkpoint = Checkpoint.from_directory(source)
    made = checkpoint.to_directory()
    assert _tree(Path(made)) == expected
    empty = tmp_path / "empty"
    empty.mkdir()
    assert checkpoint.to_directory(empty) == str(empty)
    assert _tree(empty) == expected
    fresh = tmp_path / "a" / "b" / "new"
    assert checkpoint.to_directory(str(fresh)) == str(fresh)
    assert _tree(fresh) == expected
    full = tmp_path / "full"
    full.mkdir()
    (full / "theirs.txt").write_bytes(b"kept")
    checkpoint.to_directory(full)
    assert _tree(full) == {**expected, "theirs.txt": b"kept"}
    monkeypatch.chdir(tmp_path)
    assert checkpoint.to_directory("relative") == str(tmp_path / "relative")
    assert _tree(tmp_path / "relative") == expected
    assert checkpoint.to_directory("./s3:") == str(tmp_path / "s3:")  # a local name, spelled so
