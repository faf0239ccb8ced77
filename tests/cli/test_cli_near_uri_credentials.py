"""A run directory given to ``cairn`` as a mistyped URI that carries credentials
(``s3:/KEY:SECRET@bucket``, ``s3:KEY:...``, ``S3:/...``, ``gs:/...``, ``s3//KEY:...``) is
refused with the corrected URI, its user info masked on stderr and in ``--json``'s
``{"error": ...}``; ``s3//...`` is not taken for a local directory whose path is printed.
A token given as the user name (``https://TOKEN@host``) is masked whole, and so is a
near-URI a log line quotes."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from cairn._src.cli.main import SafeFormatter, main

SECRET = "SUPERSECRET"
NEAR_URIS = [
    (f"s3:/AKIA:{SECRET}@bucket/runs", "s3:/AKIA:***@bucket/runs"),
    (f"s3:AKIA:{SECRET}@bucket/runs", "s3:AKIA:***@bucket/runs"),
    (f"S3:/AKIA:{SECRET}@bucket/runs", "S3:/AKIA:***@bucket/runs"),
    (f"gs:/user:{SECRET}@bucket/runs", "gs:/user:***@bucket/runs"),
    (f"s3//KEY:{SECRET}@bucket/runs", "s3//KEY:***@bucket/runs"),
]
COMMANDS = [["ls"], ["show"], ["verify"], ["rebuild-index"], ["lease", "break"],
            ["prune", "--keep", "1"], ["goodput"], ["plot", "--metric", "x"]]


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        code = main(list(args))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize(("typed", "shown"), NEAR_URIS)
def test_a_mistyped_uri_is_refused_with_its_credentials_masked(
        command: list[str], typed: str, shown: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, *command, typed, "--json")
    assert code == 2
    assert SECRET not in out + err
    expected = f"location={shown!r} is not a valid URI: a scheme is followed by '://'"
    name = "lease break" if command[0] == "lease" else command[0]
    assert f"cairn {name}: error: {expected}" in err
    assert json.loads(out)["error"].startswith(expected)
    assert str(tmp_path) not in out + err  # not read as a local directory


def test_a_token_given_as_the_user_name_is_masked_whole(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "show", f"memory://ghp_{SECRET}@nowhere/runs/r", "--json")
    assert code == 2
    assert SECRET not in out + err
    assert "memory://***@nowhere/runs/r" in json.loads(out)["error"]


def test_a_log_line_masks_a_near_uri() -> None:
    record = logging.LogRecord("cairn.x", logging.WARNING, __file__, 1,
                               "could not read %s", (f"s3:/AKIA:{SECRET}@bucket/runs",), None)
    line = SafeFormatter("%(message)s").format(record)
    assert line == "could not read s3:/AKIA:***@bucket/runs"
