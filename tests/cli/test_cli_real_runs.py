"""Every ``cairn`` subcommand, with and without ``--json``, over real runs: one finished,
one failed (rank 1 raises ValueError, twice), one whose driver was killed (kill -9) after a
commit, and one still running (its train loop waits on a file the test controls). Each run
is made once for the module; subcommands that change a run work on a copy. Every
``--json`` document is checked against the schema docs/cli.md documents."""

from __future__ import annotations

import dataclasses
import json
import os
import pty
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cli_workloads
import doc_schema
import pytest
from driver_process import wait_for

import cairn
from cairn._src.checkpoint.index import read_index, write_index
from cairn._src.checkpoint.manager import checkpoint_view
from cairn._src.checkpoint.manifest import read_manifest
from cairn._src.cli import runs as cli_runs
from cairn._src.cli.common import RETRY
from cairn._src.cli.main import main
from cairn._src.errors import CheckpointDamagedError
from cairn._src.run.layout import INDEX_NAME, LEASE_NAME
from cairn._src.storage.location import resolve

pytestmark = pytest.mark.slow
DRIVER = os.path.join(os.path.dirname(__file__), "cli_driver.py")


@dataclass
class Runs:
    storage: Path
    release: Path
    running_pid: int
    killed_pid: int

    def __getitem__(self, name: str) -> str:
        return str(self.storage / name)


def _committed(run: Path, name: str) -> bool:
    try:
        index = json.loads((run / INDEX_NAME).read_text())
    except (FileNotFoundError, ValueError):
        return False
    return name in [c.get("dir_name") for c in index.get("checkpoints", [])]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    root = tmp_path_factory.mktemp("real_runs")
    storage, release = root / "storage", root / "release"

    def start(name: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, DRIVER, str(storage), name, str(release)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    running, killed = start("running"), start("interrupted")
    try:
        cairn.Trainer(cli_workloads.train, train_loop_config={"steps": 4},
                      run_config=cairn.RunConfig(
                          name="finished", storage_path=str(storage),
                          checkpoint_config=cairn.CheckpointConfig(
                              num_to_keep=2, checkpoint_score_attribute="loss",
                              checkpoint_score_order="max"))).fit()
        with pytest.raises(cairn.WorkerGroupError):
            cairn.Trainer(cli_workloads.fail_on_rank_one,
                          scaling_config=cairn.ScalingConfig(num_workers=2),
                          run_config=cairn.RunConfig(
                              name="failed", storage_path=str(storage),
                              failure_config=cairn.FailureConfig(max_failures=1))).fit()
        for process, name in ((running, "running"), (killed, "interrupted")):
            wait_for(lambda n=name: _committed(storage / n, "checkpoint_000002"), process)
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        yield Runs(storage, release, running.pid, killed.pid)
    finally:
        release.touch()
        for process in (running, killed):
            try:
                process.communicate(timeout=120)
            finally:
                process.kill()


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def cli_json(capsys: pytest.CaptureFixture[str], schema: str, *args: str,
             code: int = 0) -> Any:
    got, out, err = cli(capsys, *args, "--json")
    assert got == code, err
    document = json.loads(out)
    doc_schema.check(document, schema)
    return document


def copy_of(runs: Runs, name: str, tmp_path: Path) -> str:
    copy = tmp_path / name
    shutil.copytree(runs[name], copy)
    return str(copy)


# --- ls ------------------------------------------------------------------------------------

def test_ls_gives_each_run_its_status(runs: Runs, capsys: pytest.CaptureFixture[str]) -> None:
    data = cli_json(capsys, "ls", "ls", str(runs.storage))
    by_name = {r["name"]: r for r in data["runs"]}
    assert {name: r["status"] for name, r in by_name.items()} == {
        "finished": "finished", "failed": "failed", "interrupted": "interrupted",
        "running": "running"}
    assert by_name["failed"]["attempts"] == 2 and by_name["failed"]["failures"] == 2
    assert by_name["finished"]["last_report"] == 4
    assert by_name["running"]["last_report"] == 2 and by_name["interrupted"]["last_report"] == 2
    code, out, _ = cli(capsys, "ls", str(runs.storage))
    assert code == 0
    status = {line.split()[0]: line.split()[1] for line in out.splitlines()[1:]}
    assert status == {"finished": "finished", "failed": "failed",
                      "interrupted": "interrupted", "running": "running"}


# --- show / inspect ------------------------------------------------------------------------

def test_show_a_finished_run_says_why_each_checkpoint_is_kept(
        runs: Runs, capsys: pytest.CaptureFixture[str]) -> None:
    doc = cli_json(capsys, "show", "show", runs["finished"])
    assert doc["status"] == "finished" and doc["error"] is None and doc["failures"] == []
    assert doc["attempts"] == 1 and doc["sessions"] == 1 and doc["driver"] is None
    assert doc["retention"] == {"num_to_keep": 2, "score_attribute": "loss",
                                "score_order": "max"}
    kept = {c["dir_name"]: [r["code"] for r in c["kept_because"]] for c in doc["checkpoints"]}
    # loss = 1/(step+1): the best two by max are the first two reports; the driver dropped
    # the third and kept the fourth, the latest.
    assert kept == {"checkpoint_000001": ["best"], "checkpoint_000002": ["best"],
                    "checkpoint_000004": ["latest"]}
    assert [c["score"] for c in doc["checkpoints"]] == [1.0, 0.5, 0.25]
    assert all(c["status"] == "COMMITTED" and c["location"] == "run" and c["size_bytes"] == 1
               for c in doc["checkpoints"])
    code, out, _ = cli(capsys, "show", runs["finished"])
    assert code == 0
    assert "status     finished\n" in out
    assert "attempts   1 attempt in 1 driver session, 0 failures" in out
    assert "driver     none" in out
    assert "keeps      the best 2 by loss (max), the latest one" in out
    assert "failures (" not in out
    lines = {line.split()[0]: line for line in out.splitlines()
             if line.startswith("checkpoint_")}
    assert sorted(lines) == ["checkpoint_000001", "checkpoint_000002", "checkpoint_000004"]
    assert lines["checkpoint_000001"].endswith("#1 of the best 2 by loss (max)")
    assert lines["checkpoint_000002"].endswith("#2 of the best 2 by loss (max)")
    assert lines["checkpoint_000004"].endswith("the latest checkpoint")
    assert " committed " in lines["checkpoint_000004"]


def test_show_a_failed_run_gives_the_error_and_every_failure(
        runs: Runs, capsys: pytest.CaptureFixture[str]) -> None:
    doc = cli_json(capsys, "show", "show", runs["failed"])
    assert doc["status"] == "failed"
    # The user's own exception, not the WorkerGroupError around it.
    assert doc["error"] == {"type": "ValueError", "ranks": [1],
                            "message": "rank one gives up"}
    assert doc["attempts"] == 2
    assert [(f["attempt"], f["ranks"]) for f in doc["failures"]] == [(0, [1]), (1, [1])]
    for failure in doc["failures"]:
        assert failure["reason"] == "[rank 1] ValueError: rank one gives up"
        [error] = failure["errors"]
        frame = error.pop("frame")
        assert error == {"type": "ValueError", "ranks": [1], "message": "rank one gives up"}
        assert os.path.basename(frame["file"]) == "cli_workloads.py"
        assert frame["function"] == "fail_on_rank_one"
        assert isinstance(failure["t"], float) and failure["counted"] is True
    assert doc["failures"][0]["t"] < doc["failures"][1]["t"]
    # Without num_to_keep, every checkpoint is kept; the second attempt resumed from the
    # first one, and protects it no longer: it committed the second one.
    assert doc["resumed_from"] == "checkpoint_000001"
    assert [[r["code"] for r in c["kept_because"]] for c in doc["checkpoints"]] == [
        ["all"], ["all", "latest"]]
    code, out, _ = cli(capsys, "show", runs["failed"])
    assert code == 0
    assert "status     failed: ValueError on rank 1: rank one gives up" in out
    assert "attempts   2 attempts in 1 driver session, 2 failures" in out
    assert "failures (2):" in out
    failure_lines = [line for line in out.splitlines() if "  attempt " in line]
    assert len(failure_lines) == 2
    for attempt, line in enumerate(failure_lines):
        assert f"attempt {attempt}  rank 1: [rank 1] ValueError: rank one gives up" in line
    assert "the run's last attempt resumed from it" not in out


def test_show_a_run_whose_driver_was_killed(
        runs: Runs, capsys: pytest.CaptureFixture[str]) -> None:
    doc = cli_json(capsys, "show", "show", runs["interrupted"])
    assert doc["status"] == "interrupted" and doc["error"] is None
    assert doc["driver"] is None and doc["failures"] == []
    assert doc["latest"] == "checkpoint_000002"
    assert [c["dir_name"] for c in doc["checkpoints"]] == ["checkpoint_000001",
                                                           "checkpoint_000002"]
    code, out, _ = cli(capsys, "show", runs["interrupted"])
    assert code == 0
    assert "status     interrupted (the driver stopped before the run ended" in out
    assert "driver     none" in out
    assert "attempts   1 attempt in 1 driver session, 0 failures" in out


def test_show_a_running_run_names_its_driver(
        runs: Runs, capsys: pytest.CaptureFixture[str]) -> None:
    doc = cli_json(capsys, "show", "show", runs["running"])
    assert doc["status"] == "running" and doc["error"] is None
    assert doc["driver"]["pid"] == runs.running_pid
    code, out, _ = cli(capsys, "show", runs["running"])
    assert code == 0
    assert "status     running" in out
    assert f"driver     live: host {doc['driver']['host']}, pid {runs.running_pid}" in out


def test_inspect_prints_what_show_prints(runs: Runs, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("finished", "failed"):
        shown = cli(capsys, "show", runs[name])
        assert cli(capsys, "inspect", runs[name]) == shown
        assert cli_json(capsys, "show", "inspect", runs[name]) == \
            cli_json(capsys, "show", "show", runs[name])


# --- verify --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["finished", "failed", "interrupted", "running"])
def test_verify_every_run(name: str, runs: Runs, capsys: pytest.CaptureFixture[str]) -> None:
    doc = cli_json(capsys, "verify", "verify", runs[name])
    count = {"finished": 3, "failed": 2, "interrupted": 2, "running": 2}[name]
    assert (doc["verified"], doc["failed"], doc["dropped"]) == (count, 0, 0)
    assert all(c["status"] == "ok" and c["files"] == 1 and c["size_bytes"] == 1
               and c["error"] is None for c in doc["checkpoints"])
    code, out, err = cli(capsys, "verify", runs[name])
    assert code == 0
    assert out.count("(1 file, 0.00 MiB)") == count
    assert out.endswith(f"{count} verified, 0 failed\n")
    assert err == ""


def test_verify_a_damaged_copy(runs: Runs, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    run = copy_of(runs, "failed", tmp_path)
    Path(run, "checkpoint_000002", "state.txt").write_text("9")
    doc = cli_json(capsys, "verify", "verify", run, code=1)
    assert (doc["verified"], doc["failed"]) == (1, 1)
    bad = doc["checkpoints"][1]
    assert bad["dir_name"] == "checkpoint_000002" and bad["status"] == "failed"
    assert "state.txt" in bad["error"] and bad["files"] is None
    code, out, _ = cli(capsys, "verify", run)
    assert code == 1 and "FAILED  checkpoint_000002" in out and "1 verified, 1 failed" in out


# --- prune ---------------------------------------------------------------------------------

def test_prune_dry_run_says_what_is_kept_and_why(
        runs: Runs, capsys: pytest.CaptureFixture[str]) -> None:
    before = sorted(os.listdir(runs["finished"]))
    doc = cli_json(capsys, "prune", "prune", runs["finished"], "--keep", "1", "--score", "loss",
                   "--order", "min", "--dry-run")
    assert doc["dry_run"] is True and doc["keep"] == 1 and doc["order"] == "min"
    assert [(k["dir_name"], [r["code"] for r in k["kept_because"]]) for k in doc["kept"]] == [
        ("checkpoint_000004", ["best", "latest"])]
    assert [(d["dir_name"], d["deleted"]) for d in doc["dropped"]] == [
        ("checkpoint_000001", False), ("checkpoint_000002", False)]
    code, out, _ = cli(capsys, "prune", runs["finished"], "--keep", "1", "--score", "loss",
                       "--dry-run")
    assert code == 0
    assert out.startswith("ranking by loss (max), the run's own checkpoint_score_order\n")
    assert "would keep checkpoint_000001: #1 of the best 1 by loss (max)" in out
    assert "would keep checkpoint_000004: the latest checkpoint" in out
    assert "would drop checkpoint_000002" in out
    assert out.endswith("1 checkpoint to drop, 2 kept\n")
    assert sorted(os.listdir(runs["finished"])) == before


def test_prune_keeps_the_checkpoint_the_run_resumed_from_until_a_newer_one_committed(
        runs: Runs, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = copy_of(runs, "failed", tmp_path)
    # The last attempt resumed from checkpoint_000001 and committed checkpoint_000002.
    code, out, _ = cli(capsys, "prune", run, "--keep", "1", "--dry-run")
    assert code == 0
    assert "would drop checkpoint_000001" in out
    assert "1 checkpoint to drop, 1 kept" in out
    # As if checkpoint_000002 had been committed by the attempt before: the last attempt
    # committed nothing after the one it resumed from, which stays.
    location = resolve(run)
    index = read_index(location, RETRY)
    assert index is not None and index.attempts == 2
    write_index(location, index.with_changes(checkpoints=tuple(
        dataclasses.replace(r, attempt=0) for r in index.checkpoints)), RETRY)
    code, out, _ = cli(capsys, "prune", run, "--keep", "1", "--dry-run")
    assert code == 0
    assert "would keep checkpoint_000001: the run's last attempt resumed from it" in out
    assert "0 checkpoints to drop, 2 kept" in out
    run = copy_of(runs, "finished", tmp_path)
    # Without --score, the run's own ranking: the best by loss (max) and the latest stay.
    doc = cli_json(capsys, "prune", "prune", run, "--keep", "1")
    assert doc["dry_run"] is False and (doc["score"], doc["order"]) == ("loss", "max")
    assert [d["dir_name"] for d in doc["dropped"]] == ["checkpoint_000002"]
    assert all(d["deleted"] for d in doc["dropped"])
    assert sorted(n for n in os.listdir(run) if n.startswith("checkpoint_")) == [
        "checkpoint_000001", "checkpoint_000004"]
    code, out, _ = cli(capsys, "prune", run, "--keep", "1")
    assert code == 0 and out.endswith("0 checkpoints to drop, 2 kept\n")


def test_prune_keeps_a_checkpoint_whose_validation_is_pending(
        runs: Runs, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The driver stopped after it asked for a validation of checkpoint_000001: the run
    # validates it again when it continues, so prune must not delete it.
    from cairn._src.run.layout import EVENTS_DIR
    from cairn._src.run.segment_log import SegmentLog

    run = copy_of(runs, "finished", tmp_path)
    events = SegmentLog(resolve(run).join(EVENTS_DIR), RETRY)
    events.append({"type": "validation_requested", "t": 1.0, "dir_name": "checkpoint_000001"})
    events.flush()
    doc = cli_json(capsys, "prune", "prune", run, "--keep", "1", "--score", "loss",
                   "--order", "min")
    assert [(k["dir_name"], [r["code"] for r in k["kept_because"]]) for k in doc["kept"]] == [
        ("checkpoint_000001", ["pending_validation"]),
        ("checkpoint_000004", ["best", "latest"])]
    assert [d["dir_name"] for d in doc["dropped"]] == ["checkpoint_000002"]
    assert sorted(n for n in os.listdir(run) if n.startswith("checkpoint_")) == [
        "checkpoint_000001", "checkpoint_000004"]
    code, out, _ = cli(capsys, "prune", run, "--keep", "1", "--score", "loss", "--order", "min",
                       "--dry-run")
    assert code == 0 and "would keep checkpoint_000001: its validation is pending" in out


def test_prune_refuses_a_running_run(runs: Runs, capsys: pytest.CaptureFixture[str]) -> None:
    doc = cli_json(capsys, "error", "prune", runs["running"], "--keep", "1", code=2)
    assert doc["command"] == "prune"
    assert f"pid {runs.running_pid}, heartbeat " in doc["error"]
    code, out, err = cli(capsys, "prune", runs["running"], "--keep", "1", "--dry-run")
    assert code == 2 and out == ""
    assert err.startswith("cairn prune: error: The run at ") and len(err.splitlines()) == 1
    assert " is live: held by host " in err


# --- rebuild-index, lease break, errors ----------------------------------------------------

def test_rebuild_index_and_lease_break_of_the_killed_run(
        runs: Runs, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    run = copy_of(runs, "interrupted", tmp_path)
    assert os.path.exists(os.path.join(run, LEASE_NAME))
    doc = cli_json(capsys, "lease-break", "lease", "break", run)
    assert doc["previous"]["pid"] == runs.killed_pid
    code, out, _ = cli(capsys, "lease", "break", run)
    assert code == 0 and "there was no readable lease" in out
    code, out, _ = cli(capsys, "rebuild-index", run)
    assert code == 0 and "rebuilt the index of" in out and out.endswith("2 checkpoints\n")
    # rebuild-index holds the run's lease while it runs: it takes over the lease the
    # killed driver left (saying so) and leaves none behind.
    shutil.rmtree(run)
    run = copy_of(runs, "interrupted", tmp_path)
    code, _, err = cli(capsys, "rebuild-index", run, "--json")
    assert code == 0, err
    assert f"Taking over the lease of a driver that is gone (host {socket.gethostname()}, " \
        f"pid {runs.killed_pid}," in caplog.text
    assert not [n for n in os.listdir(run) if n.startswith(("lease", "_cairn_lease"))]


def test_rebuild_index_of_a_torn_index_keeps_the_failure_budget(
        runs: Runs, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = copy_of(runs, "failed", tmp_path)
    with open(os.path.join(run, INDEX_NAME), "w") as f:
        f.write('{"torn')
    code, _, err = cli(capsys, "rebuild-index", run)
    assert code == 0, err
    with open(os.path.join(run, INDEX_NAME)) as f:
        index = json.load(f)
    # Counted again from the event log, as fit() counts them: not a fresh budget.
    assert (index["attempts"], index["failures"]) == (2, 2)


@pytest.mark.parametrize("command", [["show"], ["inspect"], ["verify"], ["prune", "--keep", "1"],
                                     ["rebuild-index"]])
def test_json_errors_are_json_and_exit_2(command: list[str], tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes").mkdir()
    doc = cli_json(capsys, "error", command[0], str(tmp_path / "notes"), *command[1:], code=2)
    assert doc["command"] == command[0]
    assert "notes" in doc["error"]
    with pytest.raises(json.JSONDecodeError):
        json.loads(cli(capsys, command[0], str(tmp_path / "notes"), *command[1:])[1])


# --- the progress bar of verify ------------------------------------------------------------

def _verify_with_a_terminal_stderr(run: str, *extra: str) -> tuple[int, str, str]:
    """``cairn verify`` with stdout a pipe and stderr a pseudo-terminal."""
    leader, follower = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "100"}
    process = subprocess.Popen([sys.executable, "-m", "cairn", "verify", run, *extra],
                               stdout=subprocess.PIPE, stderr=follower, env=env)
    os.close(follower)
    terminal = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the process closed the terminal
            break
        if not chunk:
            break
        terminal += chunk
    os.close(leader)
    assert process.stdout is not None
    out = process.stdout.read().decode()
    process.stdout.close()
    return process.wait(timeout=120), out, terminal.decode(errors="replace")


def test_verify_shows_a_progress_bar_only_on_a_terminal(runs: Runs) -> None:
    code, out, terminal = _verify_with_a_terminal_stderr(runs["finished"])
    assert code == 0, terminal
    assert "verifying checkpoint_" in terminal
    assert out.endswith("3 verified, 0 failed\n") and "verifying" not in out
    code, out, terminal = _verify_with_a_terminal_stderr(runs["finished"], "--json")
    assert code == 0 and "verifying" not in terminal
    doc_schema.check(json.loads(out), "verify")
    done = subprocess.run([sys.executable, "-m", "cairn", "verify", runs["finished"]],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.endswith("3 verified, 0 failed\n")


class RecordedProgress:
    """What verify_files tells a shown progress bar."""

    shown = True

    def __init__(self) -> None:
        self.advanced: list[int] = []

    def advance(self, size: int) -> None:
        self.advanced.append(size)


def test_with_the_bar_a_checkpoint_is_verified_in_parts_with_the_same_errors(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cairn.Trainer(cli_workloads.three_files,
                  run_config=cairn.RunConfig(name="r", storage_path=str(tmp_path))).fit()
    run = resolve(str(tmp_path / "r"))
    index = read_index(run, RETRY)
    assert index is not None
    view = checkpoint_view(run, index.checkpoints[0])
    manifest = read_manifest(view.manifest_at, RETRY)
    assert manifest is not None
    monkeypatch.setattr(cli_runs, "BAR_STEP_BYTES", 15)
    progress = RecordedProgress()
    cli_runs.verify_files(view, manifest.files, progress)  # type: ignore[arg-type]
    assert progress.advanced == [20, 10]  # a and b, then c
    (tmp_path / "r" / "checkpoint_000001" / "c").write_text("x" * 10)
    (tmp_path / "r" / "checkpoint_000001" / "a").write_text("y" * 10)
    with pytest.raises(CheckpointDamagedError) as plain:
        cli_runs.verify_files(view, manifest.files, cli_runs.VerifyProgress([], shown=False))
    with pytest.raises(CheckpointDamagedError, match=r"^2 of 3 files under .*") as parts:
        cli_runs.verify_files(view, manifest.files, RecordedProgress())  # type: ignore[arg-type]
    assert str(parts.value) == str(plain.value)
