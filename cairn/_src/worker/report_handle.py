"""The handle ``report()`` returns: follow a checkpoint to its commit."""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING

from cairn._src.errors import ReportError

if TYPE_CHECKING:
    from cairn._src.checkpoint.checkpoint import Checkpoint


# The event of every metric-only handle: done at once and never cleared, so one set
# event serves them all (a report is the hot path, and an Event costs a lock and a
# condition to make and set).
_DONE = threading.Event()
_DONE.set()


class ReportHandle:
    """The outcome of one ``report()`` call.

    ``done()`` is True once the report's checkpoint is committed (or failed); a metric-only
    report is done at once. ``wait(timeout)`` blocks until then and returns the committed
    :class:`Checkpoint` (None for a metric-only report), raising the upload's error if it
    failed or :class:`TimeoutError` when ``timeout`` passes first (None or ``math.inf``:
    no deadline; 0: look without waiting). Thread-safe.
    """

    def __init__(self, index: int, *, has_checkpoint: bool) -> None:
        self.index = index
        self.has_checkpoint = has_checkpoint
        self._event = threading.Event() if has_checkpoint else _DONE
        self._checkpoint: Checkpoint | None = None
        self._error: BaseException | None = None

    def _resolve(self, checkpoint: Checkpoint | None, error: BaseException | None) -> None:
        self._checkpoint = checkpoint
        self._error = error
        self._event.set()

    def done(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> Checkpoint | None:
        if not self._event.wait(_check_timeout(timeout)):
            raise TimeoutError(
                f"The checkpoint of report {self.index} was not committed within {timeout}s."
            )
        if self._error is not None:
            raise self._error
        return self._checkpoint

    @property
    def checkpoint(self) -> Checkpoint | None:
        """The committed checkpoint, or None while pending, failed, or metric-only."""
        return self._checkpoint if self._event.is_set() else None

    @property
    def error(self) -> BaseException | None:
        return self._error if self._event.is_set() else None

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"ReportHandle(index={self.index}, {state})"


def _check_timeout(timeout: object) -> float | None:
    """``timeout`` as :meth:`ReportHandle.wait` takes it: None for no deadline (also
    ``math.inf``, which ``threading`` cannot wait for), or seconds >= 0."""
    if timeout is None:
        return None
    if (isinstance(timeout, bool) or not isinstance(timeout, int | float)
            or math.isnan(timeout) or timeout < 0):
        raise ReportError(
            f"ReportHandle.wait(timeout={timeout!r}) must be None (wait until the report "
            "is resolved) or a number of seconds >= 0."
        )
    return None if math.isinf(timeout) else float(timeout)
