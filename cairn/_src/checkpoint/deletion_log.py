"""The run's record of the checkpoints it deletes: durable before any of their data goes.

A retention deletion is logged first (``checkpoint_deleting``, flushed), so that a later
driver that finds one of them half deleted knows it was deleted on purpose
(:mod:`.recheck`). When the flush fails (a storage outage longer than the retry budget),
no data goes: the deletions wait, with those that failed, for
``CheckpointManager.retry_deletions``, which flushes the log again first. The records
stay buffered in the event log meanwhile (a failed flush keeps them, in order), so the
retry writes them, or a later flush of the log already did.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Protocol

from cairn._src.checkpoint.index import CheckpointRecord
from cairn._src.run.events import CheckpointDeleting, Event

logger = logging.getLogger(__name__)


class EventSink(Protocol):
    """Where the manager emits the events a later driver needs (the controller's event
    stream, :class:`cairn._src.observe.observer.EventStream`). A flush that raises keeps
    what it could not write, for the next flush."""

    def emit(self, event: Event) -> None: ...

    def flush(self) -> None: ...


class DeletionLog:
    """The ``checkpoint_deleting`` records of one manager, and which of them may not be
    durable yet. Used on the commit thread only, as the manager is."""

    def __init__(self, events: EventSink | None) -> None:
        self._events = events
        # Checkpoints whose record was emitted but whose flush failed: none of their data
        # may go until a flush succeeds.
        self._unflushed: set[str] = set()

    def announce(self, records: Iterable[CheckpointRecord], *, reason: str) -> bool:
        """Log the deletion of ``records`` and flush the log; whether their data may go
        now. On a failed flush it may not: the caller defers the deletions."""
        records = list(records)
        if not records or self._events is None:
            return True
        now = time.time()
        for record in records:
            self._events.emit(CheckpointDeleting(t=now, dir_name=record.dir_name,
                                                 report_index=record.report_index,
                                                 reason=reason))
        self._unflushed.update(r.dir_name for r in records)
        return self.flush()

    def flush(self) -> bool:
        """Whether every deletion announced so far is logged durably (flushing the log
        once more when one may not be); a failed flush is logged, not raised."""
        if not self._unflushed or self._events is None:
            return True
        try:
            self._events.flush()
        except Exception as exc:
            logger.warning("Could not log the deletion of %s (the event log cannot be "
                           "written: %s); their data stays until a retry can log it",
                           sorted(self._unflushed), exc)
            return False
        self._unflushed.clear()
        return True

    def may_delete(self, dir_name: str) -> bool:
        """Whether the deletion of ``dir_name``, if announced, is logged durably."""
        return dir_name not in self._unflushed
