"""A validation request whose flush failed: its report never commits, so the request must
never reach the event log, and a later driver must neither run nor list a validation for
it, not even when a later report commits a checkpoint of the same name (a retried report
with an explicit ``checkpoint_dir_name``). Logs that already hold such a request (written
before requests were withdrawn) are read the same way."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from cairn import CheckpointConfig, RunConfig, ValidationConfig
from cairn._src.checkpoint.index import RunIndex
from cairn._src.checkpoint.manager import CheckpointManager
from cairn._src.checkpoint.views import ReadyCheckpoint
from cairn._src.cli.show import show_document
from cairn._src.controller.validations import PendingValidations, ValidationRunner
from cairn._src.errors import StorageError
from cairn._src.observe.observer import EventLogWriter, EventStream
from cairn._src.run.events import (
    CheckpointStarted,
    ValidationFinished,
    ValidationRequested,
    read_events,
)
from cairn._src.run.layout import EVENTS_DIR, METRICS_DIR
from cairn._src.run.segment_log import SegmentLog, read_log
from cairn._src.storage.checksum import FileEntry, new_hasher
from cairn._src.storage.location import StorageLocation, resolve
from cairn._src.storage.retry import RetryPolicy

# The lying store of the fault suite, imported as that suite imports it.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fault"))
import lying_store

RETRY = RetryPolicy(max_attempts=1)
NAME = "epoch_1"  # an explicit checkpoint_dir_name: a retried report reuses it


@pytest.fixture(autouse=True)
def _lying() -> None:
    lying_store.register()


def _ready(directory: str, index: int, name: str, *,
           validation: dict[str, Any] | None = None) -> ReadyCheckpoint:
    data = b"weights %d" % index
    os.makedirs(os.path.join(directory, name), exist_ok=True)
    with open(os.path.join(directory, name, "model.bin"), "wb") as f:
        f.write(data)
    hasher = new_hasher()
    hasher.update(data)
    return ReadyCheckpoint(index=index, dir_name=name, metrics={"score": float(index)},
                           entries={"model.bin": FileEntry(len(data), hasher.hexdigest())},
                           ranks=(0,), reference=None, metadata={},
                           bytes_uploaded=len(data), validation=validation)


def _driver(run: StorageLocation,
            config: ValidationConfig | None) -> tuple[SegmentLog, EventStream,
                                                      CheckpointManager, ValidationRunner]:
    events = SegmentLog(run.join(EVENTS_DIR), RETRY)
    stream = EventStream([EventLogWriter(events)], log=events)
    pending = PendingValidations()
    manager = CheckpointManager(run, CheckpointConfig(), RETRY, RunIndex(),
                                SegmentLog(run.join(METRICS_DIR), RETRY), events=stream)
    runner = ValidationRunner(config, manager, stream, submit=lambda fn: fn(),
                              wake=lambda: None, options=RunConfig(progress=0).storage_options(),
                              pending=pending)
    return events, stream, manager, runner


def _left_pending(run: StorageLocation, manager: CheckpointManager) -> set[str]:
    """The validations a later driver (without a validation config, so that none runs
    here) takes as left pending by this run's event log."""
    pending = PendingValidations()
    later = ValidationRunner(None, manager, EventStream([]), submit=lambda fn: fn(),
                             wake=lambda: None, options=RunConfig(progress=0).storage_options(),
                             pending=pending)
    later.resume(read_events(run.join(EVENTS_DIR), RETRY))
    return set(pending.jobs)


@pytest.mark.parametrize("logged_after", [False, True],
                         ids=["nothing-logged-after", "more-logged-after"])
def test_a_request_whose_flush_failed_is_never_logged_run_or_listed(
        tmp_path: Path, logged_after: bool) -> None:
    root, control = str(tmp_path / "storage"), str(tmp_path / "control")
    run = resolve(lying_store.lying_uri(root, control)).join("run")
    directory = os.path.join(root, "store", "run")
    events, stream, manager, runner = _driver(run, ValidationConfig(lambda c: {"score": 9.0}))
    # The write of the request is kept by the store, and its answer lost: the flush fails.
    lying_store.add_rule(control, "lost_answer", f"{EVENTS_DIR}/segment_", times=1)
    abandoned = _ready(directory, 1, NAME, validation={})
    with pytest.raises(StorageError):
        runner.before_commit(abandoned)
    assert lying_store.lies_told(control) == {"lost_answer": 1}
    assert runner.status(NAME).value == "COMMITTED"  # not pending in this driver either
    # The report is abandoned (report_outcomes.not_handed_to_commit). The driver's next
    # flush of its logs succeeds, with or without newer records.
    if logged_after:
        stream.emit(CheckpointStarted(t=2.0, dir_name=NAME, index=2))
    assert events.dirty
    events.flush()
    assert not events.dirty
    types = [r["type"] for r in read_log(run.join(EVENTS_DIR), RETRY)]
    assert ValidationRequested.TYPE not in types
    assert types == (["checkpoint_started"] if logged_after else [])
    # The retried report commits under the same name, without a validation.
    retried = _ready(directory, 2, NAME)
    runner.before_commit(retried)
    manager.commit(retried, attempt=1)
    events.flush()
    assert _left_pending(run, manager) == set()
    # What `cairn show` lists for it.
    document = show_document(run, manager.index, read_events(run.join(EVENTS_DIR), RETRY),
                             None)
    assert [(c["dir_name"], c["status"]) for c in document["checkpoints"]] == [
        (NAME, "COMMITTED")]


def test_a_later_driver_ignores_a_logged_request_of_a_report_that_never_committed(
        tmp_path: Path) -> None:
    run = resolve(str(tmp_path / "run"))
    events, stream, manager, _ = _driver(run, None)
    # A log that holds the request of report 1, which never committed (written before such
    # requests were withdrawn, or by a driver that crashed before its next flush), and the
    # request of report 3, which did commit and was not validated yet.
    stream.emit(ValidationRequested(t=1.0, dir_name=NAME, index=1, task={}))
    stream.emit(ValidationRequested(t=3.0, dir_name="epoch_3", index=3, task={}))
    events.flush()
    # Report 2 committed the name of report 1, without a validation.
    manager.commit(_ready(str(tmp_path / "run"), 2, NAME), attempt=1)
    manager.commit(_ready(str(tmp_path / "run"), 3, "epoch_3", validation={}), attempt=1)
    assert _left_pending(run, manager) == {"epoch_3"}
    # Once report 3's validation finished, nothing is left.
    stream.emit(ValidationFinished(t=4.0, dir_name="epoch_3", index=3, status="VALIDATED",
                                   metrics={}))
    events.flush()
    assert _left_pending(run, manager) == set()


def test_a_request_already_written_is_withdrawn_from_the_open_segment_only(
        tmp_path: Path) -> None:
    run = resolve(str(tmp_path / "run"))
    events = SegmentLog(run.join(EVENTS_DIR), RETRY, records_per_segment=2)
    stream = EventStream([EventLogWriter(events)], log=events)

    def logged() -> list[str | None]:
        return [r.get("dir_name") for r in read_log(run.join(EVENTS_DIR), RETRY)]

    # Written by an earlier flush (another thread's) to the open segment: that segment is
    # written again without it.
    first = ValidationRequested(t=1.0, dir_name="a", index=1, task={})
    stream.emit(first)
    events.flush()
    assert stream.withdraw(first)
    assert events.dirty
    events.flush()
    assert logged() == []
    # In a closed segment: it stays.
    second = ValidationRequested(t=2.0, dir_name="b", index=2, task={})
    stream.emit(second)
    stream.emit(ValidationRequested(t=3.0, dir_name="c", index=3, task={}))
    events.flush()
    assert not stream.withdraw(second)
    assert not events.dirty
    assert logged() == ["b", "c"]
