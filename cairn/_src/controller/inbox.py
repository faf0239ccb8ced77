"""The controller loop's inbox: typed items from its helper threads, and a wake-up pipe.

The acceptor hands over authenticated connections (:class:`NewConnection`), the commit
thread the result of each commit (:class:`CommitResult`), the validation thread the news
that a result was applied (:class:`ValidationApplied`). Any thread may :meth:`Inbox.post`;
only the controller loop takes items out. The loop waits on :attr:`Inbox.wake_r` together
with the workers' connections, so an item wakes it without polling.
"""

from __future__ import annotations

import os
import queue
from dataclasses import dataclass
from multiprocessing.connection import Connection

from cairn._src.checkpoint.manager import CommitOutcome
from cairn._src.checkpoint.views import ReadyCheckpoint


@dataclass(frozen=True)
class NewConnection:
    """A worker's authenticated connection and what its hello said."""

    connection: Connection
    rank: int
    pid: int
    attempt: int


@dataclass(frozen=True)
class CommitResult:
    """One commit's result, from the commit thread: ``outcome`` or ``error``.

    ``holder`` is the run-directory entry that holds a checkpoint committed by reference
    (None otherwise), looked up on the commit thread, the checkpoint manager's owner.
    """

    ready: ReadyCheckpoint
    outcome: CommitOutcome | None
    error: BaseException | None
    holder: str | None = None


@dataclass(frozen=True)
class ValidationApplied:
    """A validation result was applied: a waiting request may be answerable now."""


InboxItem = NewConnection | CommitResult | ValidationApplied


class Inbox:
    """A queue of :data:`InboxItem` and the pipe that wakes the loop. Thread-safe."""

    def __init__(self) -> None:
        self._items: queue.Queue[InboxItem] = queue.Queue()
        self.wake_r, self._wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)

    def post(self, item: InboxItem) -> None:
        """Hand ``item`` to the controller loop and wake it (any thread)."""
        self._items.put(item)
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def next_item(self) -> InboxItem | None:
        """The next item, or None when the inbox is empty (the loop's thread)."""
        try:
            return self._items.get_nowait()
        except queue.Empty:
            return None

    def clear_wake(self) -> None:
        try:
            os.read(self.wake_r, 4096)
        except BlockingIOError:
            pass

    def close(self) -> None:
        os.close(self.wake_r)
        os.close(self._wake_w)
