"""The small-file copy processes import nothing from the working directory (issue 26,
item 2): a shared working directory could hold a ``json.py`` that would run inside
``cairn verify`` or ``to_directory()``."""

from __future__ import annotations

import os
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
