"""The handle ``report()`` returns: follow a checkpoint to its commit."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

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
    failed or :class:`TimeoutError` when ``timeout`` passes first. Thread-safe.
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
        if not self._event.wait(timeout):
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
