"""The small-file copy processes import nothing from the working directory (issue 26,
item 2): a shared working directory could hold a ``json.py`` that would run inside
``cairn verify`` or ``to_directory()``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from cairn._src.storage import batch

# The modules a copy process imports first (its bootstrap, then _smallio's imports).
PLANTED = ("json", "runpy", "marshal", "errno", "stat", "contextlib", "typing", "xxhash")


@pytest.fixture
def planted_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory whose every planted module writes a marker when imported."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    for module in PLANTED:
        (cwd / f"{module}.py").write_text(
            "import os\n"
            f"open(os.path.join({str(tmp_path)!r}, 'imported_{module}'), 'w').close()\n"
            "raise SystemExit(3)\n")
    monkeypatch.chdir(cwd)
    return tmp_path


def test_copy_processes_import_nothing_from_the_working_directory(
        planted_cwd: Path, few_files_a_share: list[int], caplog: pytest.LogCaptureFixture) -> None:
    source = planted_cwd / "source"
    names = [f"d{i % 2}/file_{i}.bin" for i in range(16)]
    for name in names:
        path = source / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(100))
    dest = planted_cwd / "dest"
    for directory in ("d0", "d1"):
        (dest / directory).mkdir(parents=True)
    entries, left = batch.run(batch.Job("upload", str(source), str(dest), max_workers=4),
                              dict.fromkeys(names))
    assert left == set() and sorted(entries) == sorted(names)
    hashed, left = batch.run(batch.Job("hash", str(dest), max_workers=4), dict.fromkeys(names))
    assert left == set() and hashed == entries
    assert len(few_files_a_share) == 6  # three copy processes for each call
    imported = sorted(p.name for p in planted_cwd.iterdir() if p.name.startswith("imported_"))
    assert imported == []
    # Every share was copied by a copy process that worked, none by the fallback.
    assert not batch._copy_processes_failed, caplog.text


def test_copy_processes_start_isolated_and_without_the_site_module(
        tmp_path: Path, few_files_a_share: list[int], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    # No .pth file of a site directory runs in a copy process (-S), and nothing of the
    # working directory or PYTHON* variables (-I): an interpreter named python* that
    # records its arguments, then runs the real one.
    recorded = tmp_path / "arguments"
    interpreter = tmp_path / "python-recording"
    interpreter.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" >> {str(recorded)!r}\n'
                           f'exec {sys.executable!r} "$@"\n')
    interpreter.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(interpreter))
    source = tmp_path / "source"
    names = [f"d{i % 2}/file_{i}.bin" for i in range(8)]
    for name in names:
        path = source / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(10))
    hashed, left = batch.run(batch.Job("hash", str(source), max_workers=2),
                             dict.fromkeys(names))
    assert not left and sorted(hashed) == sorted(names)
    assert few_files_a_share == [1] and not batch._copy_processes_failed, caplog.text
    arguments = recorded.read_text().splitlines()
    assert arguments[:3] == ["-I", "-S", "-c"]
