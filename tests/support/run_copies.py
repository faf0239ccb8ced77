"""A test's own copy of a run a module made once, and planted link loops in it."""

from __future__ import annotations

import shutil
from pathlib import Path


def copy_of_run(pristine: Path, tmp_path: Path) -> Path:
    """``pristine`` (a run directory) copied to ``tmp_path/storage/run``, for one test to
    damage."""
    copy = tmp_path / "storage" / "run"
    shutil.copytree(pristine, copy)
    return copy


def make_link_loop(path: Path) -> None:
    """``path`` replaced by a symbolic link to itself."""
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    path.symlink_to(path.name)
