"""Guards that keep a storage-safety test from hanging when the code under test is wrong."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

T = TypeVar("T")


def bounded(fn: Callable[[], T], seconds: float = 240.0) -> T:
    """``fn()``, run on a daemon thread; the test fails, rather than hangs, if it blocks.

    The limit is a guard against a read that never ends, not a duration being tested.
    """
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = fn()
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True, name="bounded-call")
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"the call blocked for {seconds:.0f}s: a read that never ends")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")  # type: ignore[return-value]


def release_fifos(paths: list[str]) -> None:
    """Open each FIFO for writing and close it: a reader wrongly blocked on one sees
    end-of-file, so its thread ends."""
    for path in paths:
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass  # No reader is blocked on it (ENXIO): nothing to release.
