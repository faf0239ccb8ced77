"""The CLI on real runs: a reference this process cannot resolve fails its own checkpoint
in ``cairn verify``, not the whole command; a checkpoint a live driver's retention drops
while ``verify`` reads it is not reported damaged; storage errors that ``verify`` and
``ls`` quote and the warnings the command logs show no URI credentials and no raw control
characters."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import cli_workloads
import pytest
from run_copies import copy_of_run

import cairn
from cairn._src.checkpoint.index import read_index, write_index
from cairn._src.cli import runs as cli_runs
from cairn._src.cli.main import main
from cairn._src.run.layout import INDEX_NAME
from cairn._src.storage.location import resolve
from cairn._src.storage.retry import RetryPolicy

SECRET_URI = "s3://alice:hunter2@bucket/x"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    storage = tmp_path_factory.mktemp("review") / "storage"
    cairn.Trainer(cli_workloads.train, train_loop_config={"steps": 3},
                  run_config=cairn.RunConfig(name="run", storage_path=str(storage))).fit()
    return storage / "run"


@pytest.fixture
def run(pristine: Path, tmp_path: Path) -> Path:
    return copy_of_run(pristine, tmp_path)


def cairn_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cairn._src.cli.main", *args],
                          capture_output=True, text=True, timeout=120)


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def edit_record(run: Path, dir_name: str, **fields: Any) -> None:
    index = json.loads((run / INDEX_NAME).read_text())
    for record in index["checkpoints"]:
        if record["dir_name"] == dir_name:
            record.update(fields)
    (run / INDEX_NAME).write_text(json.dumps(index))


def test_verify_fails_only_the_checkpoint_whose_reference_it_cannot_resolve(run: Path) -> None:
    # A scheme the training script registered in code: this process does not know it.
    edit_record(run, "checkpoint_000002", target_uri="nosuchstore://bucket/ckpt")
    done = cairn_cli("verify", str(run), "--json")
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    document = json.loads(done.stdout)
    statuses = {c["dir_name"]: c["status"] for c in document["checkpoints"]}
    assert statuses == {"checkpoint_000001": "ok", "checkpoint_000002": "failed",
                        "checkpoint_000003": "ok"}
    failed = next(c for c in document["checkpoints"] if c["status"] == "failed")
    assert "nosuchstore" in failed["error"]
    assert (document["verified"], document["failed"]) == (2, 1)


def test_verify_does_not_call_a_checkpoint_retention_dropped_meanwhile_damaged(
        run: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    real_verify_files = cli_runs.verify_files
    location = resolve(str(run))

    def retention_drops_it_first(view: Any, files: Any, progress: Any) -> None:
        if view.dir_name == "checkpoint_000002":
            # What a live driver's retention does: the index stops naming it, then its
            # files are deleted.
            index = read_index(location, RetryPolicy())
            assert index is not None
            write_index(location, index.with_changes(checkpoints=tuple(
                r for r in index.checkpoints if r.dir_name != view.dir_name)), RetryPolicy())
            shutil.rmtree(run / view.dir_name)
        real_verify_files(view, files, progress)

    monkeypatch.setattr(cli_runs, "verify_files", retention_drops_it_first)
    code, out, err = run_cli(capsys, "verify", str(run), "--json")
    assert code == 0, out + err
    document = json.loads(out)
    assert [c["dir_name"] for c in document["checkpoints"]] == ["checkpoint_000001",
                                                                "checkpoint_000003"]
    assert (document["verified"], document["failed"], document["dropped"]) == (2, 0, 0)


def test_verify_still_fails_a_checkpoint_that_stays_in_the_index(run: Path) -> None:
    (run / "checkpoint_000002" / "state.txt").unlink()
    done = cairn_cli("verify", str(run))
    assert done.returncode == 1, done.stderr
    assert "FAILED  checkpoint_000002" in done.stdout
    assert "2 verified, 1 failed" in done.stdout


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_verify_masks_credentials_a_storage_error_quotes(
        json_flag: list[str], run: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    def unreachable(*args: Any, **kwargs: Any) -> None:
        raise OSError(f"could not read {SECRET_URI}/state.txt")

    monkeypatch.setattr(cli_runs, "verify_directory", unreachable)
    code, out, err = run_cli(capsys, "verify", str(run), *json_flag)
    assert code == 1
    assert "hunter2" not in out + err
    assert "s3://alice:***@bucket/x/state.txt" in out


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_ls_masks_credentials_in_the_reason_a_run_is_unreadable(
        json_flag: list[str], run: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    def unreachable(*args: Any, **kwargs: Any) -> None:
        raise OSError(f"could not reach {SECRET_URI}/cairn_run.json")

    monkeypatch.setattr(cli_runs, "read_index", unreachable)
    code, out, err = run_cli(capsys, "ls", str(run.parent), *json_flag)
    assert code == 0, err
    assert "hunter2" not in out + err
    assert "s3://alice:***@bucket/x/cairn_run.json" in out
    if json_flag:
        assert json.loads(out)["runs"][0]["status"] == "unreadable"


def test_warnings_mask_credentials_and_escape_control_characters(run: Path) -> None:
    # A reference this run never registered, as a forged index (or an older version's)
    # may name it: prune leaves it in place with a warning that quotes it.
    edit_record(run, "checkpoint_000001", target_uri="s3://alice:hunter2@bucket/x\x1b[2J")
    done = cairn_cli("prune", str(run), "--keep", "1", "--latest", "--delete-references")
    assert done.returncode == 0, done.stderr
    assert "WARNING" in done.stderr
    assert "hunter2" not in done.stderr
    assert "\x1b" not in done.stderr
    assert "s3://alice:***@bucket/x\\x1b[2J" in done.stderr
