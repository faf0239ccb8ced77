"""The observer protocol: the controller emits each event once, every listener subscribes.

An event is either a record of the run's event log (:class:`cairn._src.run.events.Event`,
one frozen dataclass per record type) or a :class:`DriverEvent`, which only the driver
sees (a worker's report, a commit with its :class:`~cairn.Checkpoint`, a failed attempt
with each rank's exception, a notice for the terminal). A driver event that the log keeps
as well carries that record in :attr:`DriverEvent.logged`: the happening is still emitted
once, and the :class:`EventLogWriter` writes its record.

The controller (and the commit pipeline, the validations and the checkpoint manager)
hands each event to one :class:`EventStream`, built by ``controller/assembly.py`` with its
observers in order: the event-log writer, the metrics-history writer, the live view, the
user callbacks. Ray Train v2 keeps such a list of ``ControllerCallback`` /
``ReportCallback``.

Threads: most events are emitted on the controller loop's thread; a few come from the
commit thread (``reference_registered``, ``checkpoint_dropped``,
``validation_finished``). An observer is called on the emitting thread, so one that
reacts to those must be thread-safe (the writers are: :class:`SegmentLog` has a lock). The
user callbacks react only to events of the loop's thread. An exception raised by an
observer propagates to the emitter (a user callback that raises fails the run, as before);
the observers after it are not called for that event.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from cairn._src.observe.driver_events import DriverEvent, Reported
from cairn._src.run.events import Event
from cairn._src.run.segment_log import SegmentLog

logger = logging.getLogger(__name__)

__all__ = ["EventLogWriter", "EventStream", "HistoryWriter", "ObservedEvent", "Observer"]

ObservedEvent = Event | DriverEvent


class Observer(Protocol):
    """Anything that follows a run: one method, called with each event as it happens.

    ``notify`` must be quick and must not block (it runs on the emitter's thread, most
    often the controller loop's); it ignores the event types it does not follow.
    """

    def notify(self, event: ObservedEvent) -> None: ...


class EventLogWriter:
    """Appends the record of every logged event to the run's event log (``<run>/events``),
    in the format :meth:`Event.to_record` gives. Thread-safe."""

    def __init__(self, log: SegmentLog) -> None:
        self.log = log

    def notify(self, event: ObservedEvent) -> None:
        record = event.logged if isinstance(event, DriverEvent) else event
        if record is not None:
            self.log.append(record.to_record())


class HistoryWriter:
    """Appends rank 0's reports to the run's metrics history (``<run>/metrics``)."""

    def __init__(self, log: SegmentLog) -> None:
        self.log = log

    def notify(self, event: ObservedEvent) -> None:
        if not isinstance(event, Reported) or event.message.rank != 0:
            return
        message = event.message
        record: dict[str, object] = {"report_index": message.index, "attempt": event.attempt,
                                     "time": message.sent_at, "metrics": message.metrics}
        if message.checkpoint is not None:
            record["checkpoint_dir_name"] = message.checkpoint.dir_name
        self.log.append(record)


class EventStream:
    """The one place events are emitted: each goes to every observer, in order.

    ``log`` is the run's event log, flushed by :meth:`flush` where a record must be
    durable before the run goes on (a validation request before its commit, a dropped
    checkpoint before the index forgets it).
    """

    def __init__(self, observers: Sequence[Observer], *, log: SegmentLog | None = None) -> None:
        self._observers = tuple(observers)
        self._log = log

    @property
    def observers(self) -> tuple[Observer, ...]:
        return self._observers

    def emit(self, event: ObservedEvent) -> None:
        for observer in self._observers:
            observer.notify(event)

    def flush(self) -> None:
        """Write the event log's buffered records to storage (storage errors propagate)."""
        if self._log is not None:
            self._log.flush()

    def withdraw(self, event: ObservedEvent) -> bool:
        """Take the record of ``event``, emitted earlier, back from the event log, so that
        no later flush writes it: for an event whose flush failed when its emitter gives up
        what it announced (the observers saw it; only the log forgets it). False when it is
        already in the log for good (:meth:`SegmentLog.withdraw`)."""
        record = event.logged if isinstance(event, DriverEvent) else event
        if self._log is None or record is None:
            return True
        return self._log.withdraw(record.to_record())
