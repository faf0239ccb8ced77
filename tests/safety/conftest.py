"""Fixtures of the storage-safety tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from guards import release_fifos


@pytest.fixture
def fifos() -> Iterator[list[str]]:
    """FIFOs a test makes (append their paths); released on teardown."""
    made: list[str] = []
    yield made
    release_fifos(made)
