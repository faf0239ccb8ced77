"""``StorageLocation.contains``: the one meaning of "inside" for locations, with
``strictly`` for "below, not the same place"."""

from __future__ import annotations

import os
from pathlib import Path

from cairn._src.storage.location import resolve


def test_contains_and_strictly_contains(tmp_path: Path) -> None:
    run = resolve(str(tmp_path / "run"))
    inside = resolve(str(tmp_path / "run" / "checkpoint_000001"))
    sibling = resolve(str(tmp_path / "run-other"))
    assert run.contains(inside) and run.contains(inside, strictly=True)
    assert run.contains(run) and not run.contains(run, strictly=True)
    assert not run.contains(sibling) and not run.contains(sibling, strictly=True)
    assert not inside.contains(run)


def test_a_link_to_a_directory_is_that_directory(tmp_path: Path) -> None:
    (tmp_path / "real" / "sub").mkdir(parents=True)
    os.symlink(tmp_path / "real", tmp_path / "link")
    real, link = resolve(str(tmp_path / "real")), resolve(str(tmp_path / "link"))
    assert real.contains(link) and not real.contains(link, strictly=True)
    assert real.contains(resolve(str(tmp_path / "link" / "sub")), strictly=True)


def test_another_bucket_is_another_store() -> None:
    run = resolve("memory://bucket/run")
    assert run.contains(resolve("memory://bucket/run/a"), strictly=True)
    assert not run.contains(resolve("memory://other/run/a"))
