"""The observer protocol: the controller emits each event once, as a typed object, to the
observers it was built with; the event log is one of them and stores exactly their
records."""

from __future__ import annotations

from pathlib import Path

import pytest
from controller_fakes import make_harness

from cairn._src.controller.state import ControllerState
from cairn._src.errors import WorkerGroupError
from cairn._src.observe.driver_events import (
    AttemptFailed,
    DriverEvent,
    Notice,
    Reported,
    WorkerGroupStarted,
)
from cairn._src.observe.observer import EventLogWriter, EventStream, ObservedEvent
from cairn._src.run.events import (
    AttemptStart,
    Event,
    Failure,
    FirstReport,
    SessionEnd,
    SessionStart,
    WorkersReady,
    read_events,
)
from cairn._src.run.layout import EVENTS_DIR
from cairn._src.run.segment_log import SegmentLog
from cairn._src.storage.location import resolve
from cairn._src.storage.retry import RetryPolicy
from cairn._src.wire.messages import ReportMessage


class Recorder:
    def __init__(self) -> None:
        self.events: list[ObservedEvent] = []

    def notify(self, event: ObservedEvent) -> None:
        self.events.append(event)


def _logged(events: list[ObservedEvent]) -> list[Event]:
    found = []
    for event in events:
        record = event.logged if isinstance(event, DriverEvent) else event
        if record is not None:
            found.append(record)
    return found


def test_each_event_reaches_every_observer_once_and_the_log_keeps_their_records(
        tmp_path: Path) -> None:
    recorder = Recorder()
    harness = make_harness(tmp_path, max_failures=1, observers=[recorder])
    controller = harness.controller
    controller.step()
    workers = harness.backend.groups[-1]
    peers = [harness.connect(worker) for worker in workers]
    assert peers and controller.step().new is ControllerState.RUNNING
    for worker in workers:
        assert worker.peer is not None
        worker.peer.send(ReportMessage(worker.rank, 1, {"loss": 1.0}, None, 0.0))
    harness.error(workers[1])
    assert controller.step().new is ControllerState.RESTARTING
    harness.close()

    kinds = [type(e) for e in recorder.events]
    assert kinds[:4] == [SessionStart, Notice, AttemptStart, WorkerGroupStarted]
    assert WorkersReady in kinds
    assert kinds.count(AttemptStart) == 1 and kinds.count(FirstReport) == 1
    reported = [e for e in recorder.events if isinstance(e, Reported)]
    assert sorted(e.message.rank for e in reported) == [0, 1]
    failed = [e for e in recorder.events if isinstance(e, AttemptFailed)]
    assert len(failed) == 1 and isinstance(failed[0].error, WorkerGroupError)
    assert isinstance(failed[0].record, Failure) and failed[0].record.ranks == (1,)
    assert isinstance(recorder.events[-1], SessionEnd)
    # The log holds the records of the logged events, each once, in the order emitted.
    on_disk = read_events(harness.manager.run.join(EVENTS_DIR), harness.manager.retry)
    assert [e.to_record() for e in on_disk] == [e.to_record()
                                                for e in _logged(recorder.events)]


def test_an_observer_that_raises_stops_the_event_there_and_reaches_the_emitter(
        tmp_path: Path) -> None:
    log = SegmentLog(resolve(str(tmp_path)).join(EVENTS_DIR), RetryPolicy())
    after = Recorder()

    class Broken:
        def notify(self, event: ObservedEvent) -> None:
            raise ValueError("observer broke")

    stream = EventStream([EventLogWriter(log), Broken(), after], log=log)
    with pytest.raises(ValueError, match="observer broke"):
        stream.emit(SessionStart(t=1.0))
    stream.flush()
    assert [e.type for e in read_events(resolve(str(tmp_path)).join(EVENTS_DIR),
                                        RetryPolicy())] == ["session_start"]
    assert after.events == []
