"""Failures on the driver's side while it handles the ranks' messages: a storage error of
its own is no rank's lost connection, a validation result it could not record keeps its
checkpoint, and a skipped upload deletes only what Cairn's own uploads wrote. Also: the
ranks of a later attempt that have not reported yet have reached the report before it."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from multiprocessing import Pipe
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from controller_fakes import FakeWorker, Harness, make_harness

from cairn import CheckpointConfig, RunConfig, ValidationConfig
from cairn._src.checkpoint.index import CheckpointRecord, RunIndex
from cairn._src.checkpoint.manager import CheckpointManager
from cairn._src.checkpoint.reported import ReportedCheckpointStatus
from cairn._src.checkpoint.retention import make_policy
from cairn._src.checkpoint.views import ReadyCheckpoint
from cairn._src.controller.attempt import Attempt
from cairn._src.controller.connections import WorkerChannels
from cairn._src.controller.inbox import Inbox
from cairn._src.controller.reported_service import ReportedCheckpointsService
from cairn._src.controller.reports import ReportTracker
from cairn._src.controller.services import AttemptServices
from cairn._src.controller.state import ControllerState
from cairn._src.controller.validations import (
    PendingValidations,
    ProtectPending,
    ValidationRunner,
)
from cairn._src.errors import StorageError, UnknownSchemeError
from cairn._src.observe.observer import EventLogWriter, EventStream
from cairn._src.run.events import read_events
from cairn._src.run.layout import EVENTS_DIR, METRICS_DIR
from cairn._src.run.segment_log import SegmentLog
from cairn._src.storage.checksum import FileEntry, new_hasher
from cairn._src.storage.location import resolve
from cairn._src.storage.retry import RetryPolicy
from cairn._src.wire.messages import (
    CheckpointIntent,
    ReportedCheckpointsRequest,
    ReportMessage,
    UploadedMessage,
    UploadFailedMessage,
)

S = ControllerState
RETRY = RetryPolicy(max_attempts=1)


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    made = make_harness(tmp_path, workers=1)
    yield made
    made.close()


def _running(harness: Harness) -> FakeWorker:
    harness.controller.step()
    [worker] = harness.backend.groups[-1]
    harness.connect(worker)
    assert harness.controller.step().new is S.RUNNING
    return worker


# --- 1. a storage error while handling a message -----------------------------------------


def test_an_error_of_the_handler_is_not_the_ranks_connection_breaking() -> None:
    channels = WorkerChannels("127.0.0.1", inbox=Inbox())
    try:
        worker = FakeWorker(0, 0)
        ours, theirs = Pipe()
        attempt = Attempt(number=0, tracker=ReportTracker(1, used_dir_names=set()),
                          resume=None, first_report_index=1, started_at=0.0,
                          workers=[worker], connections={0: ours}, connected={0})  # type: ignore[list-item]
        theirs.send("a message")

        def handle(message: object) -> None:
            raise StorageError("the event log cannot be written")

        with pytest.raises(StorageError, match="event log"):
            channels.read(attempt, 0, ours, handle, 0.0)
        assert attempt.connections == {0: ours} and not ours.closed
        assert attempt.failures == [] and attempt.exits_awaited == {}
        # A connection that does break still is the rank's going.
        theirs.close()
        channels.read(attempt, 0, ours, lambda message: None, 0.0)
        assert 0 not in attempt.connections
        assert [f.went for f in attempt.failures] == [True]
    finally:
        channels.close()


def test_a_validation_request_that_cannot_be_recorded_fails_the_attempt_with_its_error(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    worker = _running(harness)
    stream = harness.controller._parts.events
    real_flush = stream.flush
    calls: list[int] = []

    def flush() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise StorageError("the event log refused a write")
        real_flush()

    monkeypatch.setattr(stream, "flush", flush)
    assert worker.peer is not None
    intent = CheckpointIntent("checkpoint_000001", "SYNC", files={"m": 1}, validation={})
    worker.peer.send(ReportMessage(0, 1, {}, intent, 0.0))
    worker.peer.send(UploadedMessage(0, 1, {"m": FileEntry(1, "c")}, None, 1, 0.0))
    change = harness.controller.step()
    assert change.new is S.ERRORED
    attempt = harness.controller.attempt
    assert attempt is not None
    assert not any(f.went for f in attempt.failures), attempt.failures
    outcome = harness.controller.outcome
    assert outcome is not None and outcome.error is not None
    text = str(outcome.error)
    assert "closed its connection" not in text
    assert "could not record the validation request of checkpoint checkpoint_000001" in text
    assert "StorageError: the event log refused a write" in text
    # Never committed, resolved, and left for the cleanup of uncommitted reports.
    assert attempt.tracker.unresolved_before(1) == []
    assert "checkpoint_000001" in attempt.tracker.pending_dir_names()
    assert harness.manager.index.find("checkpoint_000001") is None


def test_the_listing_leaves_out_a_checkpoint_the_driver_cannot_open(
        caplog: pytest.LogCaptureFixture) -> None:
    records = [CheckpointRecord(dir_name="checkpoint_000001", report_index=1,
                                target_uri="nowhere://x/1"),
               CheckpointRecord(dir_name="checkpoint_000002", report_index=2)]

    def view(record: CheckpointRecord) -> Any:
        if record.target_uri is not None:
            raise UnknownSchemeError("no backend handles nowhere://")
        return record.dir_name

    manager: Any = SimpleNamespace(index=SimpleNamespace(checkpoints=records), view=view)
    validations: Any = SimpleNamespace(
        status=lambda name: ReportedCheckpointStatus.COMMITTED)
    services = AttemptServices(1, manager, validations, CheckpointConfig())
    assert services.listing() == (("checkpoint_000002", "COMMITTED"),)
    assert "Not listing checkpoint_000001" in caplog.text


# --- 2. the ranks of a later attempt that have not reported yet -------------------------------


def test_ranks_without_a_report_in_this_attempt_reached_the_report_before_its_first() -> None:
    tracker = ReportTracker(2, used_dir_names=set(), first_index=10)
    service = ReportedCheckpointsService()
    # Rank 0 resumed at report 9 and asks before either rank reported in this attempt.
    service.on_request(ReportedCheckpointsRequest(0, 1, 9, "VALIDATED", None), now=0.0)
    assert tracker.missing_ranks(9) == [] and tracker.missing_ranks(10) == [0, 1]
    # A validation of report 9 is still pending: not answerable yet, and no problem.
    assert service.take_answerable(tracker, lambda index: True, now=0.0) == []
    assert service.check(tracker, done=[1], timeout_s=10.0, now=1.0) is None
    assert service.check(tracker, done=[], timeout_s=10.0, now=100.0) is None
    [answered] = service.take_answerable(tracker, lambda index: False, now=100.0)
    assert answered.index == 9


# --- 3. a validation result that cannot be recorded -----------------------------------------


def _ready(run_dir: Path, index: int, score: float, *,
           validation: dict[str, Any] | None = None) -> ReadyCheckpoint:
    name = f"checkpoint_{index:06d}"
    data = b"weights %d" % index
    (run_dir / name).mkdir(parents=True)
    (run_dir / name / "model.bin").write_bytes(data)
    hasher = new_hasher()
    hasher.update(data)
    return ReadyCheckpoint(index=index, dir_name=name, metrics={"score": score},
                           entries={"model.bin": FileEntry(len(data), hasher.hexdigest())},
                           ranks=(0,), reference=None, metadata={},
                           bytes_uploaded=len(data), validation=validation)


def test_a_validation_result_that_cannot_be_recorded_keeps_the_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = resolve(str(tmp_path / "run"))
    events = SegmentLog(run.join(EVENTS_DIR), RETRY)
    stream = EventStream([EventLogWriter(events)], log=events)
    pending = PendingValidations()
    config = CheckpointConfig(num_to_keep=1, checkpoint_score_attribute="score")
    manager = CheckpointManager(run, config, RETRY, RunIndex(),
                                SegmentLog(run.join(METRICS_DIR), RETRY), events=stream,
                                policy=ProtectPending(make_policy(1, "score", "max"),
                                                      pending.protected))
    options = RunConfig(progress=0).storage_options()
    runner = ValidationRunner(ValidationConfig(lambda checkpoint: {"score": 5.0}), manager,
                              stream, submit=lambda fn: fn(), wake=lambda: None,
                              options=options, pending=pending)
    first = _ready(tmp_path / "run", 1, 1.0, validation={})
    runner.before_commit(first)
    manager.commit(first, attempt=0)

    def refuse(dir_name: str, metrics: dict[str, object]) -> tuple[Any, ...]:
        raise StorageError("the index cannot be written")

    monkeypatch.setattr(manager, "apply_validation", refuse)
    runner._apply(pending.jobs[first.dir_name], ReportedCheckpointStatus.VALIDATED,
                  {"score": 5.0}, threading.Event())
    monkeypatch.undo()
    runner.wait_idle()  # fit() does not wait for it
    second = _ready(tmp_path / "run", 2, 2.0)
    manager.delete_dropped(manager.commit(second, attempt=0).dropped)
    assert {r.dir_name for r in manager.index.checkpoints} == {first.dir_name,
                                                               second.dir_name}
    # The next fit() validates it again.
    events.flush()
    again = PendingValidations()
    ValidationRunner(None, manager, stream, submit=lambda fn: fn(), wake=lambda: None,
                     options=options, pending=again).resume(read_events(
                         run.join(EVENTS_DIR), RETRY))
    assert set(again.jobs) == {first.dir_name}


# --- 4. a skipped upload deletes only what Cairn's own uploads wrote -------------------------


@pytest.mark.parametrize("own", [True, False], ids=["cairn-upload", "upload-fn"])
def test_a_skipped_report_deletes_its_directory_only_when_cairn_uploaded_it(
        harness: Harness, monkeypatch: pytest.MonkeyPatch, own: bool) -> None:
    parts = harness.controller._parts
    harness.controller._parts = dataclasses.replace(parts, run_config=RunConfig(
        progress=0, failure_config=parts.run_config.failure_config,
        checkpoint_config=CheckpointConfig(upload_failure_policy="skip")))
    deleted: list[str] = []
    monkeypatch.setattr(harness.manager, "delete_uncommitted",
                        lambda names: deleted.extend(names))
    worker = _running(harness)
    assert worker.peer is not None
    intent = CheckpointIntent("mine", "SYNC", files={"m": 1}, explicit_dir_name=True,
                              upload_fn=not own)
    worker.peer.send(ReportMessage(0, 1, {}, intent, time.time()))
    worker.peer.send(UploadFailedMessage(0, 1, "the upload failed"))
    harness.done(worker)
    assert harness.controller.step().new is S.FINISHING
    attempt = harness.controller.attempt
    assert attempt is not None
    assert attempt.skipped_dirs == ({1: "mine"} if own else {})
    assert harness.controller.step().new is S.FINISHED
    assert ("mine" in deleted) is own
