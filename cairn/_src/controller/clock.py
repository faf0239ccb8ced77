"""The controller's clock: wall time, monotonic time and the wait for ready objects.

The controller reads time and waits only through a :class:`Clock`, so tests drive it
with a fake one (deadlines pass without sleeping) and no worker process.
"""

from __future__ import annotations

import time
from multiprocessing.connection import wait
from typing import Any, Protocol


class Clock(Protocol):
    def time(self) -> float:
        """Wall-clock seconds (event timestamps, the start-up timeout)."""

    def monotonic(self) -> float:
        """Seconds for deadlines."""

    def wait(self, objects: list[Any], timeout: float) -> list[Any]:
        """The ``objects`` (connections, file descriptors) ready within ``timeout``."""


class SystemClock:
    """The real clock: :mod:`time` and :func:`multiprocessing.connection.wait`."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def wait(self, objects: list[Any], timeout: float) -> list[Any]:
        return list(wait(objects, timeout))
