"""A local run directory whose path is not UTF-8 (legal on Linux: a Latin-1 'é' is the
byte 0xE9, which Python holds as the surrogate '\\udce9') is refused when it resolves,
with a ConfigError that names the argument and shows the path escaped, never a
UnicodeEncodeError from inside pyarrow."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import cairn
from cairn._src.errors import ConfigError
from cairn._src.storage.location import resolve


@pytest.fixture
def latin1_dir(tmp_path: Path) -> str:
    raw = os.fsencode(tmp_path) + b"/caf\xe9"
    os.mkdir(raw)
    (Path(os.fsdecode(raw)) / "cairn_run.json").write_text("{}")
    return os.fsdecode(raw)


def _refusal(path: str) -> str:
    """The message's start, as a pattern: the path shown as its bytes, escaped."""
    return "^" + re.escape(f"location={os.fsencode(path)!r} is not valid UTF-8 (shown as "
                           "its bytes, escaped): storage paths must be valid UTF-8")


def test_resolve_refuses_a_path_that_is_not_utf8(latin1_dir: str) -> None:
    with pytest.raises(ConfigError, match=_refusal(latin1_dir)):
        resolve(latin1_dir)
    with pytest.raises(ConfigError, match=_refusal(latin1_dir)):
        resolve(Path(latin1_dir))


def test_result_from_path_refuses_a_path_that_is_not_utf8(latin1_dir: str) -> None:
    with pytest.raises(ConfigError, match=_refusal(latin1_dir)):
        cairn.Result.from_path(latin1_dir)


def test_the_cli_prints_the_refusal(latin1_dir: str) -> None:
    cairn_cli = shutil.which("cairn", path=os.path.dirname(sys.executable))
    assert cairn_cli is not None
    done = subprocess.run([cairn_cli, "show", os.fsencode(latin1_dir), "--json"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert "UnicodeEncodeError" not in done.stdout + done.stderr
    assert "caf\\xe9' is not valid UTF-8" in done.stderr
    assert "must be valid UTF-8" in done.stdout


def test_a_lone_surrogate_is_refused_too() -> None:
    with pytest.raises(ConfigError, match=r"^location='/tmp/x\\ud800' is not valid UTF-8"):
        resolve("/tmp/x\ud800")
