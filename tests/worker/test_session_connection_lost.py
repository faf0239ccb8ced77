"""A worker session whose connection to the controller ends while it waits for an
answer (local mode: the attempt ends and its connection is closed), and a stop that
comes in the middle of a NO_UPLOAD report, with the controller's end played by the test
(no processes): every wait ends, so that nothing blocks for good."""

from __future__ import annotations

from collections.abc import Iterator
from multiprocessing import Pipe
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

from cairn import Checkpoint
from cairn._src.errors import AttemptStopped
from cairn._src.storage.retry import RetryPolicy
from cairn._src.wire.messages import (
    ProceedMessage,
    ReportMessage,
    StopMessage,
    UploadedMessage,
)
from cairn._src.worker import session as session_module
from cairn._src.worker.session import WorkerSession
from tests.worker.test_session_answers import INDEX, _in_thread, _received, _setup


@pytest.fixture
def session(tmp_path: Path) -> Iterator[tuple[WorkerSession, Connection]]:
    ours, theirs = Pipe()
    worker = WorkerSession(theirs, _setup(str(tmp_path / "run")), RetryPolicy(),
                           on_controller_lost=lambda: None)
    yield worker, ours
    worker.close()
    ours.close()


def _checkpoint(tmp_path: Path) -> Checkpoint:
    directory = tmp_path / "local"
    directory.mkdir()
    (directory / "shard_0").write_bytes(b"shard 0")
    return Checkpoint.from_directory(str(directory))


def _is_report(message: object) -> bool:
    return isinstance(message, ReportMessage) and message.checkpoint is not None


@pytest.mark.parametrize("answered", ["nothing", "go-ahead"])
def test_an_async_upload_waiting_for_an_answer_ends_with_the_connection(
    session: tuple[WorkerSession, Connection], tmp_path: Path, answered: str
) -> None:
    # The attempt ends (the train function failed) while the upload waits for its
    # go-ahead, or, uploaded, for its commit; then the connection closes.
    worker, controller = session
    handle = worker.report({"step": 1}, checkpoint=_checkpoint(tmp_path),
                           checkpoint_upload_mode="ASYNC")
    _received(controller, until=_is_report)
    if answered == "go-ahead":
        controller.send(ProceedMessage(INDEX))
        _received(controller, until=lambda m: isinstance(m, UploadedMessage))
    worker.close()
    controller.close()
    joining, _ = _in_thread(worker.join)
    joining.join(30)
    assert not joining.is_alive(), "joining the session waits for an answer that never comes"
    with pytest.raises(AttemptStopped, match="controller connection ended"):
        handle.wait(timeout=0)
    # Not committed: the user's directory stays.
    assert (tmp_path / "local" / "shard_0").read_bytes() == b"shard 0"


def test_a_sync_report_waiting_for_its_commit_ends_with_the_connection(
    session: tuple[WorkerSession, Connection], tmp_path: Path
) -> None:
    worker, controller = session
    reporting, outcome = _in_thread(lambda: worker.report(
        {"step": 1}, checkpoint=_checkpoint(tmp_path)))
    _received(controller, until=_is_report)
    controller.send(ProceedMessage(INDEX))
    _received(controller, until=lambda m: isinstance(m, UploadedMessage))
    controller.close()
    reporting.join(30)
    assert not reporting.is_alive(), "a SYNC report() waits for a commit that never comes"
    assert isinstance(outcome[0], AttemptStopped)


def test_a_reference_report_the_attempt_stops_during_raises_the_stop(
    session: tuple[WorkerSession, Connection], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # keep_survivors: the stop comes while a NO_UPLOAD report checks its reference on
    # storage. Its handle, registered after the stop released every waiting one, would
    # never resolve: the report raises the stop, as SYNC and ASYNC reports do.
    worker, controller = session
    checkpoint = _checkpoint(tmp_path)
    checked = session_module.reference_location

    def stop_while_checking(*args: Any) -> Any:
        location = checked(*args)
        controller.send(StopMessage(0, "rank 1 failed"))
        assert worker._stop_event.wait(30)
        return location

    monkeypatch.setattr(session_module, "reference_location", stop_while_checking)
    with pytest.raises(AttemptStopped, match="rank 1 failed"):
        worker.report({"step": 1}, checkpoint=checkpoint,
                      checkpoint_upload_mode="NO_UPLOAD")
    assert not any(_is_report(m) for m in _received(controller, timeout=0.1))
