"""The CLI on a run whose own files were replaced by what Cairn never writes, continued: a
symbolic link loop (``x -> x``) is damage as a FIFO is (``lease break`` clears it,
``rebuild-index`` replaces it, ``verify`` fails that checkpoint), and metrics nested deeper
than stored values may go are one error naming the index, never a RecursionError."""

from __future__ import annotations

import json
from pathlib import Path

import cli_workloads
import pytest
from run_copies import copy_of_run, make_link_loop

import cairn
from cairn._src.cli.main import main
from cairn._src.run import schema
from cairn._src.run.layout import INDEX_NAME, LEASE_NAME


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    storage = tmp_path_factory.mktemp("loops") / "storage"
    cairn.Trainer(cli_workloads.train, train_loop_config={"steps": 2},
                  scaling_config=cairn.ScalingConfig(num_workers=0),
                  run_config=cairn.RunConfig(name="run", storage_path=str(storage))).fit()
    return storage / "run"


@pytest.fixture
def run(pristine: Path, tmp_path: Path) -> Path:
    return copy_of_run(pristine, tmp_path)


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_lease_break_clears_a_lease_that_is_a_link_loop(
        force: list[str], run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_link_loop(run / LEASE_NAME)
    (run / "_cairn_lease.3").touch()
    assert main(["lease", "break", *force, str(run)]) == 0, capsys.readouterr().err
    assert "there was no readable lease" in capsys.readouterr().out
    assert not (run / LEASE_NAME).is_symlink() and not (run / "_cairn_lease.3").exists()


def test_lease_break_removes_a_link_to_a_file_elsewhere_and_leaves_that_file(
        run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    elsewhere = tmp_path / "users_notes.json"
    elsewhere.write_text('{"mine": true}')
    (run / LEASE_NAME).symlink_to(elsewhere)
    assert main(["lease", "break", str(run)]) == 0, capsys.readouterr().err
    assert not (run / LEASE_NAME).is_symlink()
    assert elsewhere.read_text() == '{"mine": true}'


def test_lease_break_leaves_a_directory_in_the_leases_place(
        run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (run / LEASE_NAME).mkdir()
    (run / LEASE_NAME / "notes.txt").write_text("someone's")
    (run / "_cairn_lease.3").touch()
    assert main(["lease", "break", "--force", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cairn lease break: error: ") and len(err.strip().splitlines()) == 1, err
    assert "lease.json is a directory, not a lease a driver wrote" in err
    assert "nothing was removed" in err
    assert (run / LEASE_NAME / "notes.txt").read_text() == "someone's"
    assert (run / "_cairn_lease.3").exists()


def test_rebuild_index_replaces_an_index_that_is_a_link_loop(
        run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_link_loop(run / INDEX_NAME)
    assert main(["rebuild-index", str(run)]) == 0, capsys.readouterr().err
    assert "rebuilt the index" in capsys.readouterr().out
    assert not (run / INDEX_NAME).is_symlink()
    index = json.loads((run / INDEX_NAME).read_text())
    assert [c["dir_name"] for c in index["checkpoints"]] == [
        "checkpoint_000001", "checkpoint_000002"]


def test_verify_fails_a_checkpoint_whose_manifest_is_a_link_loop(
        run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_link_loop(run / "checkpoint_000002" / "_cairn_manifest.json")
    assert main(["verify", str(run)]) == 1
    out = capsys.readouterr().out
    assert "FAILED  checkpoint_000002: " in out and "1 verified, 1 failed" in out
    assert "_cairn_manifest.json is a symbolic link loop" in out


def _nested(depth: int) -> dict[str, object]:
    value: dict[str, object] = {"loss": 0.5}
    for _ in range(depth - 1):
        value = {"k": value}
    return value


@pytest.mark.parametrize("command", [["show", "--json", "RUN"], ["show", "RUN"],
                                     ["prune", "--keep", "1", "--dry-run", "--json", "RUN"]])
def test_metrics_nested_deeper_than_stored_values_go_are_an_error_naming_the_index(
        command: list[str], run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    index = json.loads((run / INDEX_NAME).read_text())
    index["checkpoints"][-1]["metrics"] = _nested(500)
    (run / INDEX_NAME).write_text(json.dumps(index))
    assert main([str(run) if word == "RUN" else word for word in command]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert (f"The run index {run / INDEX_NAME} is invalid: field 'checkpoints[1].metrics'"
            in err)
    assert f"expected an object nested at most {schema.MAX_STORED_DEPTH} levels deep" in err


def test_ls_json_names_a_run_whose_metrics_nest_too_deep_unreadable(
        run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    index = json.loads((run / INDEX_NAME).read_text())
    index["checkpoints"][-1]["metrics"] = _nested(500)
    (run / INDEX_NAME).write_text(json.dumps(index))
    assert main(["ls", "--json", str(run.parent)]) == 0
    [entry] = json.loads(capsys.readouterr().out)["runs"]
    assert entry["status"] == "unreadable" and "cairn_run.json is invalid" in entry["reason"]


def test_metrics_as_deep_as_stored_values_go_are_shown(
        run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    deep = _nested(schema.MAX_STORED_DEPTH)
    index = json.loads((run / INDEX_NAME).read_text())
    index["checkpoints"][-1]["metrics"] = deep
    (run / INDEX_NAME).write_text(json.dumps(index))
    assert main(["ls", "--json", str(run.parent)]) == 0
    assert json.loads(capsys.readouterr().out)["runs"][0]["last_metrics"] == deep
    assert main(["show", "--json", str(run)]) == 0
    capsys.readouterr()
