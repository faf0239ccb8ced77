"""Runs the storage conformance suite on every backend Cairn supports out of the box."""

from __future__ import annotations

from pathlib import Path

import pytest
from conformance import StorageConformance


class TestConformance(StorageConformance):
    @pytest.fixture
    def base_uri(self, storage_uri: str) -> str:
        return storage_uri


class TestConformanceFsspecLocal(StorageConformance):
    """The local disk reached through fsspec's ``local://`` protocol (a PyFileSystem)."""

    @pytest.fixture
    def base_uri(self, tmp_path: Path) -> str:
        return f"local://{tmp_path}/storage"
