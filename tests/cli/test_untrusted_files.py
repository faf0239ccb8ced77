"""The CLI reads untrusted files: whatever a run directory holds, a one-line message and
exit code 2 (1 for a checkpoint that fails verification), never a traceback. Run as a real
``cairn`` process, against a real run whose files are then damaged."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import cli_workloads
import pytest

import cairn


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    storage = tmp_path_factory.mktemp("untrusted") / "storage"
    cairn.Trainer(cli_workloads.train, train_loop_config={"steps": 2},
                  run_config=cairn.RunConfig(name="run", storage_path=str(storage))).fit()
    return storage / "run"


@pytest.fixture
def run(pristine: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(pristine, copy)
    return copy


def cairn_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cairn._src.cli.main", *args],
                          capture_output=True, text=True, timeout=120)


INDEXES = {
    "not_json": b"{not json",
    "wrong_types": json.dumps({"version": 1, "checkpoints": "abc"}).encode(),
    "string_report_index": json.dumps({"version": 1, "checkpoints": [
        {"dir_name": "checkpoint_000001", "report_index": "1"}]}).encode(),
    "dot_dot": json.dumps({"version": 1, "checkpoints": [
        {"dir_name": "..", "report_index": 1}]}).encode(),
    "deep": b"[" * 200_000 + b"]" * 200_000,
    "binary": bytes(range(256)),
}


@pytest.mark.parametrize("case", sorted(INDEXES))
@pytest.mark.parametrize("command", [["inspect"], ["verify"], ["goodput"],
                                     ["prune", "--keep", "1"], ["plot", "--metric", "loss"],
                                     ["show", "--json"], ["verify", "--json"],
                                     ["prune", "--keep", "1", "--dry-run", "--json"]])
def test_a_malformed_index_gives_exit_2_and_no_traceback(
    case: str, command: list[str], run: Path
) -> None:
    (run / "cairn_run.json").write_bytes(INDEXES[case])
    done = cairn_cli(command[0], str(run), *command[1:])
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert done.stderr.startswith(f"cairn {command[0]}: error: ")
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    if "--json" in command:
        assert json.loads(done.stdout)["error"] == done.stderr.strip().split(": error: ", 1)[1]


@pytest.mark.parametrize("content", [b"{not json", b'{"version": 1, "files": 5}', b"\xff" * 64])
def test_a_malformed_manifest_fails_verification_without_a_traceback(
    content: bytes, run: Path
) -> None:
    (run / "checkpoint_000002" / "_cairn_manifest.json").write_bytes(content)
    done = cairn_cli("verify", str(run))
    assert done.returncode == 1, done.stderr
    assert "FAILED  checkpoint_000002" in done.stdout and "1 verified, 1 failed" in done.stdout
    assert "Traceback" not in done.stderr + done.stdout


@pytest.mark.parametrize("log", ["metrics", "events"])
def test_malformed_log_records_give_no_traceback(log: str, run: Path) -> None:
    segment = sorted((run / log).iterdir())[0]
    segment.write_bytes(b'{"report_index": "x", "metrics": 5}\n[1, 2\n\xff\xfe\n' + b"[" * 100_000)
    for command in (["plot", "--metric", "loss"], ["goodput"], ["inspect"], ["show", "--json"]):
        done = cairn_cli(command[0], str(run), *command[1:])
        assert done.returncode in (0, 2), done.stderr
        assert "Traceback" not in done.stderr + done.stdout


@pytest.mark.parametrize("lease", [b"{not json", b'{"pid": "abc"}', b"[]"])
def test_a_malformed_lease_is_no_live_driver(lease: bytes, run: Path) -> None:
    (run / "lease.json").write_bytes(lease)
    done = cairn_cli("inspect", str(run))
    assert done.returncode == 0, done.stderr
    assert "driver     none" in done.stdout
    done = cairn_cli("prune", str(run), "--keep", "1", "--dry-run")
    assert done.returncode == 0, done.stderr


def test_lease_break_of_a_directory_without_a_run(tmp_path: Path) -> None:
    # A path that holds no run, or the user's own directory with a lease.json of its own:
    # exit 2, nothing removed.
    done = cairn_cli("lease", "break", str(tmp_path / "nothing"))
    assert done.returncode == 2, done.stderr
    assert "nothing" in done.stderr and "holds no run (no run index, no event log, no " \
        "lease a driver wrote); nothing removed." in done.stderr
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "lease.json").write_text('{"my": "own file"}')
    (tmp_path / "mine" / "_cairn_lease.7").write_text("mine too")
    done = cairn_cli("lease", "break", str(tmp_path / "mine"), "--json")
    assert done.returncode == 2 and done.stdout.strip().startswith("{"), done.stderr
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == [
        "_cairn_lease.7", "lease.json"]


def test_lease_break_of_a_run_without_a_readable_lease(run: Path) -> None:
    (run / "cairn_run.json").write_bytes(b"{damaged")  # a damaged index is still a run
    done = cairn_cli("lease", "break", str(run))
    assert done.returncode == 0, done.stderr
    assert "there was no readable lease" in done.stdout


def _linked_to_a_users_copy(run: Path, tmp_path: Path) -> Path:
    """checkpoint_000001 of ``run`` replaced by a link to the user's own copy of it
    (exported aside, Cairn's manifest and all); that copy."""
    exported = tmp_path / "user" / "exported_model"
    shutil.copytree(run / "checkpoint_000001", exported)
    shutil.rmtree(run / "checkpoint_000001")
    (run / "checkpoint_000001").symlink_to(exported)
    return exported


def test_prune_never_deletes_through_a_checkpoint_directory_that_is_a_link(
        run: Path, tmp_path: Path) -> None:
    exported = _linked_to_a_users_copy(run, tmp_path)
    before = sorted(p.name for p in exported.iterdir())
    done = cairn_cli("-v", "prune", str(run), "--keep", "1")
    assert done.returncode == 0, done.stderr
    assert "Not deleting checkpoint_000001: it is a symbolic link" in done.stderr
    assert sorted(p.name for p in exported.iterdir()) == before
    assert "_cairn_manifest.json" in before


def test_rebuild_index_does_not_adopt_a_checkpoint_directory_that_is_a_link(
        run: Path, tmp_path: Path) -> None:
    exported = _linked_to_a_users_copy(run, tmp_path)
    before = sorted(p.name for p in exported.iterdir())
    done = cairn_cli("-v", "rebuild-index", str(run))
    assert done.returncode == 0, done.stderr
    assert "Skipping checkpoint_000001 while rebuilding the index: it is a symbolic link" \
        in done.stderr
    index = json.loads((run / "cairn_run.json").read_text())
    assert [c["dir_name"] for c in index["checkpoints"]] == ["checkpoint_000002"]
    done = cairn_cli("prune", str(run), "--keep", "1")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in exported.iterdir()) == before


def test_rebuild_index_skips_a_checkpoint_whose_manifest_is_a_directory(run: Path) -> None:
    manifest = run / "checkpoint_000001" / "_cairn_manifest.json"
    manifest.unlink()
    manifest.mkdir()
    done = cairn_cli("-v", "rebuild-index", str(run))
    assert done.returncode == 0, done.stderr
    assert ("Skipping checkpoint_000001 while rebuilding the index: " in done.stderr
            and "_cairn_manifest.json is a directory, not a regular file" in done.stderr)
    index = json.loads((run / "cairn_run.json").read_text())
    assert [c["dir_name"] for c in index["checkpoints"]] == ["checkpoint_000002"]


def test_a_usage_error_with_json_still_prints_json(run: Path) -> None:
    done = cairn_cli("prune", str(run), "--keep", "x", "--json")
    assert done.returncode == 2
    assert json.loads(done.stdout) == {"error": "argument --keep: invalid int value: 'x'",
                                       "command": "prune"}
    assert "cairn prune: error: argument --keep: invalid int value: 'x'" in done.stderr
    done = cairn_cli("prune", str(run), "--keep", "x")  # without --json: stderr only
    assert done.returncode == 2 and done.stdout == ""
