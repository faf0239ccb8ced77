from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import cairn


@pytest.fixture
def run_config(tmp_path: Path) -> Callable[..., cairn.RunConfig]:
    """A RunConfig on a fresh local storage path; keyword arguments override fields."""

    def make(**overrides: Any) -> cairn.RunConfig:
        fields: dict[str, Any] = {"name": "run", "storage_path": str(tmp_path / "storage")}
        fields.update(overrides)
        return cairn.RunConfig(**fields)

    return make


@pytest.fixture
def scratch(tmp_path: Path) -> str:
    """A directory workers can use to leave files for the test to inspect."""
    path = tmp_path / "scratch"
    path.mkdir()
    return str(path)


def run_dir(config: cairn.RunConfig) -> str:
    assert config.storage_path is not None and config.name is not None
    return os.path.join(os.fspath(config.storage_path), config.name)
