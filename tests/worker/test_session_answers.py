"""A worker session's answers from the controller, with the controller's end of the
connection played by the test (no processes): a report skipped before this rank's
go-ahead came, a refusal that comes after this rank's upload, and a connection that ends
(or a stop that comes in the middle of a NO_UPLOAD report) while the session waits: every
wait ends, so that nothing blocks for good. A connection this process closes while the
receiver thread reads (local mode closes it from the thread that ran the train function)
ends the receiver quietly, as the end of the connection does; an error that is not a close
still reaches the thread's exception hook."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from multiprocessing import Pipe
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

from cairn import Checkpoint
from cairn._src.errors import AttemptStopped, CheckpointCollisionError, CheckpointSkippedError
from cairn._src.storage.fileio import exists, read_bytes, write_bytes_atomic
from cairn._src.storage.location import resolve
from cairn._src.storage.retry import RetryPolicy
from cairn._src.wire.messages import (
    CommittedMessage,
    ProceedMessage,
    RejectMessage,
    ReportMessage,
    SetupMessage,
    StopMessage,
    StoppedMessage,
    UploadedMessage,
)
from cairn._src.worker import main as worker_main
from cairn._src.worker import session as session_module
from cairn._src.worker.report_handle import ReportHandle
from cairn._src.worker.session import WorkerSession

INDEX = 5
SKIPPED = f"The checkpoint of report {INDEX} was skipped: rank 1: OSError: no space left"


def _setup(run: str) -> SetupMessage:
    return SetupMessage(
        rank=0, world_size=2, local_rank=0, local_world_size=2, node_rank=0, attempt=0,
        experiment_name="answers", run=resolve(run), train_fn=b"", config=b"",
        pass_config=False, resume=None, first_report_index=INDEX, score_attribute=None,
        max_pending_uploads=2, upload_failure_policy="skip", retry=b"", setup_hooks=b"",
        teardown_hooks=b"")


@pytest.fixture
def session(tmp_path: Path) -> Iterator[tuple[WorkerSession, Connection]]:
    """A session of rank 0 whose first report is report ``INDEX``, and the controller's
    end of its connection."""
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


def _received(connection: Connection, until: Callable[[Any], bool] | None = None,
              timeout: float = 0.5) -> list[Any]:
    """What the worker sent: up to the first message ``until`` accepts (30 s at most),
    or whatever arrives within ``timeout`` seconds."""
    messages: list[Any] = []
    while connection.poll(30 if until is not None else timeout):
        messages.append(connection.recv())
        if until is not None and until(messages[-1]):
            break
    return messages


def _in_thread(action: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(action())
        except BaseException as exc:  # handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def _is_report(message: Any) -> bool:
    return isinstance(message, ReportMessage) and message.checkpoint is not None


@pytest.mark.parametrize("mode", ["SYNC", "ASYNC"])
def test_a_report_skipped_before_its_go_ahead_ends_its_upload_without_uploading(
    session: tuple[WorkerSession, Connection], tmp_path: Path, mode: str
) -> None:
    # Held for a directory it shares with another rank (no verdict yet), rank 0 learns
    # the report was skipped (the other rank's upload failed): its upload ends, uploads
    # nothing, and its handle says skipped.
    worker, controller = session
    reporting, outcome = _in_thread(lambda: worker.report(
        {"step": 1}, checkpoint=_checkpoint(tmp_path), checkpoint_upload_mode=mode))
    [*_, report] = _received(controller, until=_is_report)
    assert report.index == INDEX
    controller.send(CommittedMessage(INDEX, None, error=SKIPPED, skipped=True))
    reporting.join(30)
    assert not reporting.is_alive(), "report() still waits for a verdict"
    [handle] = outcome
    assert isinstance(handle, ReportHandle)
    with pytest.raises(CheckpointSkippedError, match="was skipped: rank 1"):
        handle.wait(timeout=30)
    finishing, _ = _in_thread(worker.finish)
    finishing.join(30)
    assert not finishing.is_alive(), "the upload thread still waits for a verdict"
    assert not any(isinstance(m, UploadedMessage) for m in _received(controller))
    assert not (tmp_path / "run").exists()
    if finishing.is_alive():  # let the stuck thread go
        controller.send(RejectMessage(INDEX, CheckpointSkippedError(SKIPPED)))


@pytest.mark.parametrize("late", ["proceed", "reject"])
def test_a_verdict_that_comes_after_the_skip_is_ignored(
    session: tuple[WorkerSession, Connection], tmp_path: Path, late: str
) -> None:
    worker, controller = session
    handle = worker.report({"step": 1}, checkpoint=_checkpoint(tmp_path),
                           checkpoint_upload_mode="ASYNC")
    _received(controller, until=_is_report)
    controller.send(CommittedMessage(INDEX, None, error=SKIPPED, skipped=True))
    controller.send(ProceedMessage(INDEX) if late == "proceed"
                    else RejectMessage(INDEX, CheckpointSkippedError(SKIPPED)))
    with pytest.raises(CheckpointSkippedError):
        handle.wait(timeout=30)
    finishing, outcome = _in_thread(worker.finish)
    finishing.join(30)
    assert not finishing.is_alive() and outcome == [None]
    assert not any(isinstance(m, UploadedMessage) for m in _received(controller))
    assert not (tmp_path / "run").exists()
    # Nothing is left to raise: the next report goes through.
    assert worker.report({"step": 2}).index == INDEX + 1


def test_a_refusal_after_this_ranks_upload_is_raised_by_its_report_only(
    session: tuple[WorkerSession, Connection], tmp_path: Path
) -> None:
    # Another rank's copy of a path differs: found once every part is uploaded, so after
    # this rank's upload. The SYNC report() raises it; the next report() does not again.
    worker, controller = session
    collision = CheckpointCollisionError("Ranks 0 and 1 both wrote 'model.pt'")

    def play_controller() -> None:
        _received(controller, until=_is_report)
        controller.send(ProceedMessage(INDEX))
        _received(controller, until=lambda m: isinstance(m, UploadedMessage))
        controller.send(RejectMessage(INDEX, collision))

    playing, _ = _in_thread(play_controller)
    with pytest.raises(CheckpointCollisionError, match=r"both wrote 'model\.pt'"):
        worker.report({"step": 1}, checkpoint=_checkpoint(tmp_path))
    playing.join(30)
    assert worker.report({"step": 2}).index == INDEX + 1
    worker.finish()


def _upload_then(controller: Connection, answer: Any) -> None:
    """The controller's part: a go-ahead, this rank's upload, then ``answer``."""
    _received(controller, until=_is_report)
    controller.send(ProceedMessage(INDEX))
    _received(controller, until=lambda m: isinstance(m, UploadedMessage))
    controller.send(answer)


@pytest.mark.parametrize("answer", ["refused", "skipped"])
@pytest.mark.parametrize("mode", ["SYNC", "ASYNC"])
def test_a_directory_to_delete_after_upload_stays_when_its_report_does_not_commit(
    session: tuple[WorkerSession, Connection], tmp_path: Path, mode: str, answer: str
) -> None:
    # Uploaded, then the report is refused (another rank's copy differs) or skipped
    # (another rank's upload failed): the user's directory is the only copy; it stays.
    worker, controller = session
    checkpoint = _checkpoint(tmp_path)
    verdict = (RejectMessage(INDEX, CheckpointCollisionError("Ranks 0 and 1 both wrote x"))
               if answer == "refused" else
               CommittedMessage(INDEX, None, error=SKIPPED, skipped=True))
    playing, _ = _in_thread(lambda: _upload_then(controller, verdict))
    reporting, outcome = _in_thread(lambda: worker.report(
        {"step": 1}, checkpoint=checkpoint, checkpoint_upload_mode=mode,
        delete_local_checkpoint_after_upload=True))
    playing.join(30)
    reporting.join(30)
    assert not reporting.is_alive()
    if isinstance(outcome[0], ReportHandle):
        with pytest.raises((CheckpointCollisionError, CheckpointSkippedError)):
            outcome[0].wait(timeout=30)
    finishing, _ = _in_thread(worker.finish)
    finishing.join(30)
    assert (tmp_path / "local" / "shard_0").read_bytes() == b"shard 0"


def test_a_store_source_to_delete_after_upload_stays_until_its_report_commits(
    session: tuple[WorkerSession, Connection], tmp_path: Path
) -> None:
    # A checkpoint already on a store, copied store to store with an explicit
    # delete_local_checkpoint_after_upload=True: not deleted at its upload (another rank
    # reporting the same directory may still read it), nor at all when refused.
    worker, controller = session
    source = resolve(f"memory://answers-{tmp_path.name}/ckpt")
    write_bytes_atomic(source.join("model.pt"), b"weights")
    seen: list[bool] = []

    def play_controller() -> None:
        _received(controller, until=_is_report)
        controller.send(ProceedMessage(INDEX))
        _received(controller, until=lambda m: isinstance(m, UploadedMessage))
        seen.append(exists(source.join("model.pt")))
        controller.send(RejectMessage(INDEX, CheckpointCollisionError("differs")))

    playing, _ = _in_thread(play_controller)
    with pytest.raises(CheckpointCollisionError):
        worker.report({"step": 1}, checkpoint=Checkpoint(source.uri or ""),
                      delete_local_checkpoint_after_upload=True)
    playing.join(30)
    worker.finish()
    assert seen == [True]
    assert read_bytes(source.join("model.pt")) == b"weights"


def test_an_upload_functions_checkpoint_keeps_its_metadata(
    session: tuple[WorkerSession, Connection], tmp_path: Path
) -> None:
    # checkpoint_upload_fn: the committed checkpoint's metadata is the reported one's.
    worker, controller = session
    checkpoint = _checkpoint(tmp_path)
    checkpoint.set_metadata({"epoch": 3})
    worker.report({"step": 1}, checkpoint=checkpoint, checkpoint_upload_mode="ASYNC",
                  checkpoint_upload_fn=lambda c, _name: c)
    [*_, report] = _received(controller, until=_is_report)
    assert report.checkpoint.metadata == {"epoch": 3}
    controller.send(RejectMessage(INDEX, CheckpointSkippedError(SKIPPED)))
    worker.finish()


def test_a_snapshot_needs_the_score_on_rank_0_only(tmp_path: Path) -> None:
    # As report(): a checkpoint keeps rank 0's metrics, so rank 1 may report none.
    ours, theirs = Pipe()
    setup = replace(_setup(str(tmp_path / "run")), rank=1, score_attribute="loss")
    worker = WorkerSession(theirs, setup, RetryPolicy(), on_controller_lost=lambda: None)
    try:
        handle = worker.report_deferred({}, files=["rank_1/state.pt"], write=lambda d: None)
        assert handle.index == INDEX
        controller_view = _received(ours, until=_is_report)
        assert controller_view[-1].rank == 1
        ours.send(RejectMessage(INDEX, CheckpointSkippedError(SKIPPED)))
        worker.finish()
    finally:
        worker.close()
        ours.close()


@pytest.mark.parametrize("function_ended", [False, True])
def test_a_kept_rank_whose_driver_dies_while_it_stops_leaves(
    tmp_path: Path, function_ended: bool
) -> None:
    # keep_survivors: the controller asked this rank to stop, then its driver was killed.
    # While the train function still runs it must not go on training unobserved (it
    # leaves, as on any lost controller); once it ended, the end lets it go quietly.
    ours, theirs = Pipe()
    lost = threading.Event()
    setup = replace(_setup(str(tmp_path / "run")), keep_survivors=True)
    worker = WorkerSession(theirs, setup, RetryPolicy(), on_controller_lost=lost.set)
    try:
        ours.send(StopMessage(0, "rank 1 failed"))
        rejoining: threading.Thread | None = None
        if function_ended:
            rejoining, outcome = _in_thread(lambda: worker.wait_to_rejoin(0))
            _received(ours, until=lambda m: isinstance(m, StoppedMessage))
        ours.close()
        worker._receiver.join(30)
        assert not worker._receiver.is_alive()
        assert lost.is_set() is not function_ended
        if rejoining is not None:
            rejoining.join(30)
            assert outcome == [None]
    finally:
        worker.close()


def test_a_kept_rank_whose_driver_dies_while_it_waits_to_rejoin_leaves_with_its_children(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # It leaves as any worker whose driver is gone (worker/main.py leave(): its process
    # group with it), not quietly: the processes its train function started would outlive
    # the run.
    class Left(Exception):
        pass

    def leave() -> None:
        raise Left

    monkeypatch.setattr(worker_main, "leave", leave)
    ours, theirs = Pipe()
    setup = replace(_setup(str(tmp_path / "run")), keep_survivors=True,
                    teardown_hooks=cloudpickle.dumps([]))
    worker = WorkerSession(theirs, setup, RetryPolicy(), on_controller_lost=lambda: None)
    try:
        ours.send(StopMessage(0, "rank 1 failed"))
        stopping, outcome = _in_thread(lambda: worker_main._stop_for_rejoin(
            worker, setup, AttemptStopped("rank 1 failed")))
        _received(ours, until=lambda m: isinstance(m, StoppedMessage))
        ours.close()
        stopping.join(30)
        assert not stopping.is_alive()
        assert len(outcome) == 1 and isinstance(outcome[0], Left)
    finally:
        worker.close()


# --- the connection ends, or a stop comes, while the session waits -----------------


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


# --- a connection closed by this process while the receiver reads -----------------------

# Bounds each wait below; never reached when the code works.
EVENT_TIMEOUT_S = 60.0


class _FailsToUnpickle:
    """A message whose unpickling raises TypeError, on a connection still open."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (int, (None,))


@pytest.fixture
def thread_errors(monkeypatch: pytest.MonkeyPatch) -> list[threading.ExceptHookArgs]:
    """What would be printed as "Exception in thread ...": recorded instead."""
    errors: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", errors.append)
    return errors


@pytest.fixture
def watched_session(tmp_path: Path) -> Iterator[tuple[WorkerSession, Connection, list[str]]]:
    """A session, the controller's end of its connection, and a record of each time the
    session took the controller for lost."""
    ours, theirs = Pipe()
    lost: list[str] = []
    worker = WorkerSession(theirs, _setup(str(tmp_path / "run")), RetryPolicy(),
                           on_controller_lost=lambda: lost.append("lost"))
    yield worker, ours, lost
    worker.close()
    theirs.close()
    ours.close()


def _wait_until_reading(thread: threading.Thread) -> None:
    """Until ``thread`` waits inside a read of its connection (not before the read,
    where a closed connection is refused at once)."""
    deadline = time.monotonic() + EVENT_TIMEOUT_S
    while time.monotonic() < deadline:
        frame = sys._current_frames().get(thread.ident or 0)
        while frame is not None:
            if frame.f_code.co_name == "_recv" and "multiprocessing" in frame.f_code.co_filename:
                return
            frame = frame.f_back
        time.sleep(0.01)
    raise AssertionError(f"{thread.name} never started reading")


def test_a_close_in_this_process_ends_the_receiver_quietly(
    watched_session: tuple[WorkerSession, Connection, list[str]],
    thread_errors: list[threading.ExceptHookArgs],
) -> None:
    worker, controller, lost = watched_session
    receiver = worker._receiver
    _wait_until_reading(receiver)
    worker.close()  # the train function ended, as run_worker does before the close
    worker._connection.close()
    # The read that started before the close gets its message's header, then finds the
    # connection closed.
    controller.send(StopMessage(0, "a message in flight as the worker closes"))
    receiver.join(EVENT_TIMEOUT_S)
    assert not receiver.is_alive()
    assert [(e.exc_type, str(e.exc_value)) for e in thread_errors] == []
    assert lost == []  # the session closed first: nothing was lost


def test_a_type_error_on_an_open_connection_still_reaches_the_exception_hook(
    watched_session: tuple[WorkerSession, Connection, list[str]],
    thread_errors: list[threading.ExceptHookArgs],
) -> None:
    worker, controller, _ = watched_session
    controller.send(_FailsToUnpickle())
    worker._receiver.join(EVENT_TIMEOUT_S)
    assert [e.exc_type for e in thread_errors] == [TypeError]


def test_the_controllers_end_of_the_connection_still_means_the_controller_is_lost(
    watched_session: tuple[WorkerSession, Connection, list[str]],
    thread_errors: list[threading.ExceptHookArgs],
) -> None:
    worker, controller, lost = watched_session
    controller.close()
    worker._receiver.join(EVENT_TIMEOUT_S)
    assert lost == ["lost"]  # mid-run, the end of the connection is the controller lost
    assert thread_errors == []
