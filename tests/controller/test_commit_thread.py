"""The commit thread outlives any one task: an error in a commit's aftermath (a storage
outage while retention's deletions are logged) or in a task run there is logged and
handed to whoever waits for that task, and the next commits and tasks still run."""

from __future__ import annotations

import select
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from cairn import CheckpointConfig, RunConfig
from cairn._src.checkpoint.index import RunIndex
from cairn._src.checkpoint.manager import CheckpointManager
from cairn._src.checkpoint.views import ReadyCheckpoint
from cairn._src.controller.attempt import Attempt
from cairn._src.controller.commit_pipeline import CommitPipeline
from cairn._src.controller.inbox import CommitResult, Inbox
from cairn._src.controller.reports import ReportTracker
from cairn._src.errors import StorageError
from cairn._src.observe.observer import EventLogWriter, EventStream
from cairn._src.run.events import CheckpointDeleting, read_events
from cairn._src.run.layout import EVENTS_DIR, METRICS_DIR, default_checkpoint_dir_name
from cairn._src.run.segment_log import SegmentLog
from cairn._src.storage.checksum import FileEntry, new_hasher
from cairn._src.storage.location import StorageLocation, resolve
from cairn._src.storage.retry import RetryPolicy

RETRY = RetryPolicy(max_attempts=1)
# Long enough for any healthy machine; a hang fails the test instead of blocking it.
BOUND_S = 30.0

T = TypeVar("T")


def within_bound(what: str, call: Callable[[], T]) -> T:
    """``call()`` on a thread of its own; fails the test if it has not returned in
    :data:`BOUND_S` (the commit thread is gone: it would never return)."""
    box: list[tuple[str, Any]] = []

    def run() -> None:
        try:
            box.append(("value", call()))
        except BaseException as exc:  # handed to the test's thread
            box.append(("error", exc))

    thread = threading.Thread(target=run, name=f"test-{what}", daemon=True)
    thread.start()
    thread.join(BOUND_S)
    if thread.is_alive():
        pytest.fail(f"{what} never returned: the commit thread no longer takes tasks")
    kind, value = box[0]
    if kind == "error":
        raise value
    result: T = value
    return result


def next_result(inbox: Inbox) -> CommitResult:
    """The next commit result the commit thread posts (blocks until there is one)."""
    while True:
        item = inbox.next_item()
        if isinstance(item, CommitResult):
            return item
        if item is None:
            select.select([inbox.wake_r], [], [])
            inbox.clear_wake()


def uploaded(run_dir: Path, index: int) -> ReadyCheckpoint:
    """A checkpoint of report ``index`` whose one file the workers uploaded."""
    name = default_checkpoint_dir_name(index)
    data = b"weights %d" % index
    (run_dir / name).mkdir(parents=True)
    (run_dir / name / "model.bin").write_bytes(data)
    hasher = new_hasher()
    hasher.update(data)
    return ReadyCheckpoint(index=index, dir_name=name, metrics={"step": index},
                           entries={"model.bin": FileEntry(len(data), hasher.hexdigest())},
                           ranks=(0,), reference=None, metadata={},
                           bytes_uploaded=len(data))


def pipeline(tmp_path: Path, events: SegmentLog) -> tuple[CommitPipeline, CheckpointManager,
                                                          EventStream, Inbox]:
    run = resolve(str(tmp_path / "run"))
    stream = EventStream([EventLogWriter(events)], log=events)
    manager = CheckpointManager(run, CheckpointConfig(num_to_keep=1), RETRY, RunIndex(),
                                SegmentLog(run.join(METRICS_DIR), RETRY), events=stream)
    inbox = Inbox()
    commits = CommitPipeline(manager, stream, RunConfig(progress=0), inbox,
                             lambda attempt, message: None)
    commits.start()
    return commits, manager, stream, inbox


def attempt() -> Attempt:
    return Attempt(number=1, tracker=ReportTracker(1, used_dir_names=set()), resume=None,
                   first_report_index=1, started_at=0.0)


def failing_flush() -> None:
    raise StorageError("the store is down (after its retries)")


def deleting_logged(run: StorageLocation) -> list[str]:
    return [str(e.dir_name) for e in read_events(run.join(EVENTS_DIR), RETRY)
            if isinstance(e, CheckpointDeleting)]


def test_an_outage_while_retention_logs_its_deletions_defers_them_and_commits_go_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = tmp_path / "run"
    run = resolve(str(run_dir))
    events = SegmentLog(run.join(EVENTS_DIR), RETRY)
    commits, manager, stream, inbox = pipeline(tmp_path, events)
    try:
        # The event log cannot be flushed (an outage longer than the retry budget), while
        # num_to_keep=1 drops the previous checkpoint at each commit.
        monkeypatch.setattr(stream, "flush", failing_flush)
        current = attempt()
        for index in (1, 2, 3):
            commits.submit(current, uploaded(run_dir, index))
        results = [within_bound(f"commit result {n}", lambda: next_result(inbox))
                   for n in (1, 2, 3)]
        assert [(r.ready.index, r.error) for r in results] == [(1, None), (2, None), (3, None)]
        assert within_bound("a call on the commit thread",
                            lambda: commits.call_on_commit_thread(lambda: 1)) == 1

        # No data went before its deletion was logged durably: both are still there,
        # waiting for a retry.
        assert (run_dir / "checkpoint_000001" / "model.bin").exists()
        assert (run_dir / "checkpoint_000002" / "model.bin").exists()
        assert sorted(manager.failed_deletions) == ["checkpoint_000001", "checkpoint_000002"]
        assert deleting_logged(run) == []
        # A retry while the log still cannot be written deletes nothing either.
        assert within_bound("a retry", lambda: commits.call_on_commit_thread(
            manager.retry_deletions)) == ["checkpoint_000001", "checkpoint_000002"]
        assert (run_dir / "checkpoint_000001" / "model.bin").exists()

        # The store is back: the retry logs the deletions, then deletes.
        monkeypatch.undo()
        assert within_bound("a retry", lambda: commits.call_on_commit_thread(
            manager.retry_deletions)) == []
        assert sorted(p.name for p in run_dir.iterdir() if p.name.startswith("checkpoint_")) \
            == ["checkpoint_000003"]
        assert deleting_logged(run) == ["checkpoint_000001", "checkpoint_000002"]
    finally:
        monkeypatch.undo()
        commits.close()
        inbox.close()


def test_an_error_in_one_task_ends_neither_the_thread_nor_later_commits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = tmp_path / "run"
    events = SegmentLog(resolve(str(run_dir)).join(EVENTS_DIR), RETRY)
    commits, manager, _, inbox = pipeline(tmp_path, events)
    try:
        def broken(*args: object, **kwargs: object) -> None:
            raise RuntimeError("a bug")

        # A fire-and-forget task that raises; then a commit whose aftermath raises.
        commits.run_on_commit_thread(lambda: broken())
        monkeypatch.setattr(manager, "delete_dropped", broken)
        current = attempt()
        commits.submit(current, uploaded(run_dir, 1))
        commits.submit(current, uploaded(run_dir, 2))
        results = [within_bound(f"commit result {n}", lambda: next_result(inbox))
                   for n in (1, 2)]
        assert [(r.ready.index, r.error) for r in results] == [(1, None), (2, None)]
        # A commit that raises unexpectedly is a failed commit, reported as such.
        monkeypatch.setattr(manager, "commit", broken)
        commits.submit(current, uploaded(run_dir, 3))
        failed = within_bound("commit result 3", lambda: next_result(inbox))
        assert failed.ready.index == 3 and isinstance(failed.error, RuntimeError)
        # A task's caller gets the error raised in its own thread; the thread goes on.
        with pytest.raises(RuntimeError, match="a bug"):
            within_bound("a failing call", lambda: commits.call_on_commit_thread(
                lambda: broken()))
        assert within_bound("a call on the commit thread",
                            lambda: commits.call_on_commit_thread(lambda: 1)) == 1
    finally:
        monkeypatch.undo()
        commits.close()
        inbox.close()
