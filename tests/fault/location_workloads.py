"""A train function in a module, for tests/fault/test_failure_location.py."""

from __future__ import annotations

import cairn


def _helper(value: int) -> int:
    if value > 0:
        raise ValueError(f"module workload failed with {value}")  # the line the tests find
    return value


def fails_in_a_helper() -> None:
    cairn.report({"step": 0})
    _helper(cairn.get_context().get_world_rank() + 1)
