"""No ``cairn`` output shows a URI's credentials: errors name a location as
``StorageLocation.display()`` does (``s3://alice:***@bucket/x``), on stderr and in
``--json``'s ``{"error": ...}``, whether the URI came from the command line, from argparse
refusing a word, or from a storage library's exception text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cairn._src.cli import runs as cli_runs
from cairn._src.cli.main import main

SECRET_URI = "s3://alice:hunter2@bucket/x?region=us-east-1"


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        code = main(list(args))
    except SystemExit as exc:  # argparse's usage errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_ls_of_a_missing_storage_masks_its_credentials(
        json_flag: list[str], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli_runs, "is_dir", lambda *args, **kwargs: False)
    code, out, err = run_cli(capsys, "ls", SECRET_URI, *json_flag)
    assert code == 2
    assert "hunter2" not in out + err
    assert ("cairn ls: error: s3://alice:***@bucket/x?region=us-east-1 does not exist (or is "
            "not a directory).") in err
    if json_flag:
        assert json.loads(out) == {
            "error": "s3://alice:***@bucket/x?region=us-east-1 does not exist (or is not a "
                     "directory).", "command": "ls"}


def test_ls_of_a_missing_local_uri_masks_its_credentials(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "ls", f"file://alice:hunter2@{tmp_path}/missing", "--json")
    assert code == 2
    assert "hunter2" not in out + err
    assert json.loads(out)["error"].endswith("missing does not exist (or is not a directory).")


@pytest.mark.parametrize("argv", [
    ["lease", SECRET_URI, "break", "--json"],  # invalid choice: 'URI'
    ["show", "run", SECRET_URI, "--json"],     # unrecognized arguments: URI
])
def test_a_usage_error_masks_the_credentials_of_the_word_it_quotes(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert "hunter2" not in out + err
    assert "s3://alice:***@bucket/x" in err
    assert "s3://alice:***@bucket/x" in json.loads(out)["error"]


def test_an_error_a_storage_library_raises_masks_the_credentials_it_quotes(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def unreachable(*args: Any, **kwargs: Any) -> bool:
        raise OSError(f"could not reach {SECRET_URI}")

    monkeypatch.setattr(cli_runs, "is_dir", unreachable)
    code, out, err = run_cli(capsys, "ls", SECRET_URI, "--json")
    assert code == 2
    assert "hunter2" not in out + err
    assert json.loads(out)["error"] == ("OSError: could not reach "
                                        "s3://alice:***@bucket/x?region=us-east-1")
