"""What ``cairn`` prints when storage holds hostile names: control characters are escaped in
every human-readable line (``--json`` keeps them, escaped by JSON), a listing entry that is
not a single safe name (``..``) is skipped, and a reader that closes the pipe early ends
the command quietly."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import cli_workloads
import pytest

import cairn
from cairn._src.cli.main import main
from cairn._src.run.layout import INDEX_NAME, LEASE_NAME
from cairn._src.text import printable

# A name that, printed raw, would erase the line above and move the cursor up.
WIPE = "\x1b[2K\x1b[1A"
ESCAPED_WIPE = "\\x1b[2K\\x1b[1A"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    storage = tmp_path_factory.mktemp("output") / "storage"
    cairn.Trainer(cli_workloads.train, train_loop_config={"steps": 2},
                  run_config=cairn.RunConfig(name="run", storage_path=str(storage))).fit()
    return storage / "run"


def _rename_checkpoint(run: Path, old: str, new: str) -> None:
    """Rename checkpoint directory ``old`` to ``new``, in the index too (as a writer of the
    bucket could)."""
    (run / old).rename(run / new)
    index = json.loads((run / INDEX_NAME).read_text())
    for record in index["checkpoints"]:
        if record["dir_name"] == old:
            record["dir_name"] = new
            record["metrics"][f"bell\x07{WIPE}"] = 1.0
    (run / INDEX_NAME).write_text(json.dumps(index))


@pytest.fixture
def hostile(pristine: Path, tmp_path: Path) -> Path:
    """Storage with one run named with control characters, whose second checkpoint's
    directory and a metric name carry them too."""
    run = tmp_path / "storage" / f"run{WIPE}"
    shutil.copytree(pristine, run)
    _rename_checkpoint(run, "checkpoint_000002", f"ckpt{WIPE}")
    return run


def _assert_escaped(text: str) -> None:
    assert "\x1b" not in text and "\x07" not in text
    assert ESCAPED_WIPE in text


def test_ls_verify_and_prune_escape_control_characters(
        hostile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ls", str(hostile.parent)]) == 0
    out = capsys.readouterr().out
    _assert_escaped(out)
    assert f"run{ESCAPED_WIPE}" in out and "bell\\x07" in out
    assert main(["verify", str(hostile)]) == 0
    out = capsys.readouterr().out
    _assert_escaped(out)
    assert f"ok      ckpt{ESCAPED_WIPE} (1 file" in out
    (hostile / f"ckpt{WIPE}" / "state.txt").write_text("9")
    assert main(["verify", str(hostile)]) == 1
    out = capsys.readouterr().out
    _assert_escaped(out)
    assert f"FAILED  ckpt{ESCAPED_WIPE}: " in out
    assert main(["prune", str(hostile), "--keep", "1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    _assert_escaped(out)
    assert f"would keep ckpt{ESCAPED_WIPE}: " in out
    # --json keeps the names as they are (JSON escapes them itself).
    assert main(["verify", str(hostile), "--json"]) == 1
    out = capsys.readouterr().out
    assert "\x1b" not in out
    assert json.loads(out)["checkpoints"][1]["dir_name"] == f"ckpt{WIPE}"


def test_errors_and_lease_break_escape_what_storage_says(
        hostile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A live lease (fresh heartbeat, another host) whose host name carries ESC.
    (hostile / LEASE_NAME).write_text(json.dumps({
        "version": 1, "host": f"evil{WIPE}", "pid": 4242, "token": "f" * 32,
        "heartbeat_at": __import__("time").time(), "ttl_s": 30.0, "generation": 1}))
    assert main(["prune", str(hostile), "--keep", "1"]) == 2
    captured = capsys.readouterr()
    _assert_escaped(captured.err)
    assert f"held by host evil{ESCAPED_WIPE}, pid 4242" in captured.err
    assert main(["prune", str(hostile), "--keep", "1", "--json"]) == 2
    captured = capsys.readouterr()
    _assert_escaped(captured.err)
    assert f"host evil{WIPE}, pid 4242" in json.loads(captured.out)["error"]
    assert main(["lease", "break", str(hostile), "--force"]) == 0
    out = capsys.readouterr().out
    _assert_escaped(out)
    assert f"was host evil{ESCAPED_WIPE}, pid 4242" in out


def test_printable_escapes_control_characters_only() -> None:
    assert printable(f"a{WIPE}b\x07\x9b\x7fé ▁") == f"a{ESCAPED_WIPE}b\\x07\\x9b\\x7fé ▁"


def test_printable_escapes_a_lone_surrogate_no_terminal_could_print() -> None:
    # JSON read from storage may spell one ("\udc80"); print() of it would raise.
    assert printable("checkpoint_\udc80") == "checkpoint_\\udc80"


# --- listings that hold names which are not single safe components ------------------------

def _copy_into(store: object, run: Path, prefix: str) -> None:
    for path in run.rglob("*"):
        if path.is_file():
            key = f"{prefix}/{path.relative_to(run).as_posix()}"
            store.objects[key] = path.read_bytes()  # type: ignore[attr-defined]


def test_a_listing_with_dot_dot_and_control_characters_is_read(
        pristine: Path, dict_store: object, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    # S3 lists a key "storage/../planted.txt" as a child ".." of "storage": anyone who can
    # write the bucket can plant one.
    storage = f"planted-{uuid.uuid4().hex}"
    _copy_into(dict_store, pristine, f"{storage}/run")
    objects = dict_store.objects  # type: ignore[attr-defined]
    objects[f"{storage}/../planted.txt"] = b"x"
    objects[f"{storage}/run/../planted.txt"] = b"x"
    objects[f"{storage}/odd{WIPE}/x"] = b"x"
    objects[f"{storage}/run/_cairn_lease.\u00b2"] = b""
    uri = f"dictstore://{storage}"
    with caplog.at_level(logging.WARNING):
        assert main(["ls", uri]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out
    assert [line.split()[:2] for line in out.splitlines()[1:]] == [["run", "finished"]]
    assert "'..'" in caplog.text
    assert main(["ls", uri, "--json"]) == 0
    assert [r["name"] for r in json.loads(capsys.readouterr().out)["runs"]] == ["run"]
    assert main(["verify", f"{uri}/run"]) == 0
    assert capsys.readouterr().out.endswith("2 verified, 0 failed\n")
    assert main(["prune", f"{uri}/run", "--keep", "1", "--dry-run"]) == 0
    assert main(["lease", "break", f"{uri}/run"]) == 0
    assert "there was no readable lease" in capsys.readouterr().out


# --- a closed pipe -------------------------------------------------------------------------

def test_a_pipe_closed_early_ends_the_command_quietly(pristine: Path, tmp_path: Path) -> None:
    # More runs than one pipe buffer of lines (long names, about 300 bytes a line), so
    # cairn writes while the command runs, not only when it exits.
    storage = tmp_path / "many"
    for number in range(60):
        shutil.copytree(pristine, storage / f"{number:03d}{'r' * 200}")
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader (``head -1``) is gone before cairn writes a byte
    try:
        done = subprocess.run([sys.executable, "-m", "cairn", "ls", str(storage)],
                              stdout=write_end, stderr=subprocess.PIPE, text=True,
                              timeout=120)
    finally:
        os.close(write_end)
    assert done.stderr == ""
    assert done.returncode == 141


def test_show_escapes_the_host_a_live_lease_names(pristine: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    import time

    run = tmp_path / "run"
    shutil.copytree(pristine, run)
    (run / LEASE_NAME).write_text(json.dumps({
        "version": 1, "host": f"gpu-3{WIPE}", "pid": 1, "token": "ab" * 16,
        "heartbeat_at": time.time(), "ttl_s": 600.0, "generation": 1}))
    capsys.readouterr()
    assert main(["show", str(run)]) == 0
    out = capsys.readouterr().out
    assert f"host gpu-3{ESCAPED_WIPE}" in out and "\x1b" not in out
