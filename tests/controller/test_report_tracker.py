from __future__ import annotations

import time

import pytest

from cairn._src.controller.reports import ReportTracker
from cairn._src.errors import CheckpointCollisionError, ReportError
from cairn._src.storage.transfer import FileEntry
from cairn._src.wire.messages import (
    CheckpointIntent,
    ReportMessage,
    UploadedMessage,
    UploadFailedMessage,
    VanishedFiles,
)


def report(rank: int, index: int, files: dict[str, int] | None = None, *,
           dir_name: str | None = None, metrics: dict[str, float] | None = None) -> ReportMessage:
    intent = None
    if files is not None:
        intent = CheckpointIntent(dir_name or f"checkpoint_{index:06d}", "SYNC", files=files)
    return ReportMessage(rank, index, metrics or {"rank": rank}, intent, time.time())


def uploaded(rank: int, index: int, files: dict[str, int]) -> UploadedMessage:
    entries = {path: FileEntry(size, f"sum-{rank}-{path}") for path, size in files.items()}
    return UploadedMessage(rank, index, entries, None, sum(files.values()), 0.1)


def test_metric_only_reports_need_no_verdict_and_are_forgotten() -> None:
    tracker = ReportTracker(2, used_dir_names=set())
    assert tracker.on_report(report(0, 1)) == []
    assert tracker.on_report(report(1, 1)) == []
    assert tracker.take_ready() == []
    assert tracker.report_counts == {0: 1, 1: 1}


def test_checkpoint_commits_once_every_rank_arrived_and_uploaded() -> None:
    tracker = ReportTracker(2, used_dir_names=set())
    [verdict] = tracker.on_report(report(0, 1, {"model.pt": 4}))
    assert verdict.error is None
    tracker.on_uploaded(uploaded(0, 1, {"model.pt": 4}))
    assert tracker.take_ready() == []  # rank 1 has not reached report 1
    assert tracker.on_report(report(1, 1)) == []  # rank 1 passes None
    [ready] = tracker.take_ready()
    assert ready.dir_name == "checkpoint_000001"
    assert ready.ranks == (0,)
    assert ready.metrics == {"rank": 0}
    assert set(ready.entries) == {"model.pt"}


def test_ranks_merge_their_files() -> None:
    tracker = ReportTracker(2, used_dir_names=set())
    tracker.on_report(report(0, 1, {"a": 1}))
    tracker.on_report(report(1, 1, {"b": 1}))
    tracker.on_uploaded(uploaded(1, 1, {"b": 1}))
    assert tracker.take_ready() == []
    tracker.on_uploaded(uploaded(0, 1, {"a": 1}))
    [ready] = tracker.take_ready()
    assert set(ready.entries) == {"a", "b"}
    assert ready.ranks == (0, 1)


def test_two_ranks_writing_one_path_differently_is_refused_before_the_commit() -> None:
    # The first rank to claim the path uploads it; the other sends its size and checksum.
    tracker = ReportTracker(3, used_dir_names=set())
    [first] = tracker.on_report(report(0, 1, {"shared/model.pt": 1}))
    [second] = tracker.on_report(report(2, 1, {"shared/model.pt": 2}))
    assert (first.duplicates, second.duplicates) == ((), ("shared/model.pt",))
    tracker.on_report(report(1, 1))
    tracker.on_uploaded(uploaded(0, 1, {"shared/model.pt": 1}))
    tracker.on_uploaded(UploadedMessage(2, 1, {}, None, 0, 0.1, duplicates={
        "shared/model.pt": FileEntry(2, "other")}))
    assert tracker.take_ready() == []
    refused = tracker.take_refused()
    assert {v.rank for v in refused} == {0, 2}
    error = refused[0].error
    assert isinstance(error, CheckpointCollisionError)
    assert "Ranks 0 and 2" in str(error) and "'shared/model.pt'" in str(error)
    assert "rank 0: 1 bytes, rank 2: 2 bytes" in str(error)


def test_ranks_disagreeing_on_dir_name() -> None:
    tracker = ReportTracker(2, used_dir_names=set())
    tracker.on_report(report(0, 1, {"a": 1}, dir_name="epoch_1"))
    verdicts = tracker.on_report(report(1, 1, {"b": 1}, dir_name="epoch_one"))
    with pytest.raises(ReportError, match="rank 0 gave 'epoch_1', rank 1 gave 'epoch_one'"):
        raise verdicts[0].error  # type: ignore[misc]


def test_reused_dir_name_is_refused() -> None:
    tracker = ReportTracker(1, used_dir_names={"best"})
    [verdict] = tracker.on_report(report(0, 1, {"a": 1}, dir_name="best"))
    assert isinstance(verdict.error, ReportError)
    assert "already used" in str(verdict.error)


def test_overdue_names_missing_ranks_and_waiting_on() -> None:
    tracker = ReportTracker(3, used_dir_names=set())
    tracker.on_report(report(0, 1, {"a": 1}))
    tracker.on_report(report(1, 1))
    assert tracker.overdue(10.0) is None
    assert tracker.overdue(10.0, now=time.monotonic() + 11) == (1, [2])
    assert tracker.waiting_on(2) == 1
    assert tracker.waiting_on(1) is None


def test_mixing_an_upload_function_with_the_built_in_upload_is_refused() -> None:
    tracker = ReportTracker(2, used_dir_names=set())
    tracker.on_report(ReportMessage(0, 1, {}, CheckpointIntent(
        "checkpoint_000001", "SYNC", upload_fn=True), time.time()))
    verdicts = tracker.on_report(report(1, 1, {"b": 1}))
    with pytest.raises(ReportError, match=r"mixes checkpoint_upload_fn \(rank 0\) with "
                                          r"Cairn's own upload \(rank 1\)"):
        raise verdicts[0].error  # type: ignore[misc]


def test_ranks_far_apart_keep_reports_pending_and_each_commits_when_it_completes() -> None:
    # Rank 0 runs 1,000 metric-only reports ahead, with checkpoints at 10 and 500; rank 1
    # then catches up. take_ready() looks only at reports that changed since its last
    # call, and still returns every checkpoint as it becomes complete, in order.
    tracker = ReportTracker(2, used_dir_names=set())
    for index in range(1, 1001):
        files = {f"r0-{index}": 1} if index in (10, 500) else None
        tracker.on_report(report(0, index, files))
        if files:
            tracker.on_uploaded(uploaded(0, index, files))
        assert tracker.take_ready() == []
    committed = []
    for index in range(1, 1001):
        tracker.on_report(report(1, index))
        committed += [ready.dir_name for ready in tracker.take_ready()]
    assert committed == ["checkpoint_000010", "checkpoint_000500"]
    # An upload that completes a report after every rank arrived makes it ready too.
    tracker.on_report(report(0, 1001, {"late": 1}))
    tracker.on_report(report(1, 1001))
    assert tracker.take_ready() == []
    tracker.on_uploaded(uploaded(0, 1001, {"late": 1}))
    assert [ready.dir_name for ready in tracker.take_ready()] == ["checkpoint_001001"]


def test_a_reference_carries_its_writers_checksums_and_drops_the_ones_ranks_dispute() -> None:
    from cairn._src.storage.checksum import WrittenFile
    from cairn._src.storage.location import resolve

    def written(checksum: str) -> WrittenFile:
        return WrittenFile(FileEntry(4, checksum), mtime_ns=1, inode=2)

    where = resolve("/data/dcp/step_1")
    tracker = ReportTracker(2, used_dir_names=set())
    for rank, records in ((0, {"__0_0.distcp": written("a"), ".metadata": written("m")}),
                          (1, {"__1_0.distcp": written("b"), ".metadata": written("x")})):
        intent = CheckpointIntent("checkpoint_000001", "NO_UPLOAD", reference=where,
                                  written=records)
        tracker.on_report(ReportMessage(rank, 1, {"rank": rank}, intent, time.time()))
    [ready] = tracker.take_ready()
    assert ready.reference == where
    assert ready.written == {"__0_0.distcp": written("a"), "__1_0.distcp": written("b")}


def _shared(rank: int, index: int, files: dict[str, int]) -> ReportMessage:
    intent = CheckpointIntent("epoch_0", "ASYNC", files=files, source="machine:1:2")
    return ReportMessage(rank, index, {"rank": rank}, intent, time.time())


def test_a_file_gone_from_a_first_upload_fails_it_when_nobody_shares_the_directory() -> None:
    tracker = ReportTracker(2, used_dir_names=set())
    tracker.on_report(report(0, 1, {"a": 1, "b.tmp": 0}))
    tracker.on_report(report(1, 1))
    gone = uploaded(0, 1, {"a": 1})
    vanished = VanishedFiles(("b.tmp",), UploadFailedMessage(0, 1, "FileNotFoundError: b.tmp"))
    tracker.on_uploaded(UploadedMessage(0, 1, gone.entries, None, 1, 0.1, vanished=vanished))
    # Failed as that rank's upload would have (the caller applies the policy), not
    # committed, and not refused as a collision.
    assert tracker.take_ready() == []
    assert tracker.take_vanished() == [vanished] and tracker.take_vanished() == []
    assert tracker.take_refused() == []
    tracker.on_uploaded(uploaded(1, 1, {}))
    assert tracker.take_ready() == [] and tracker.take_vanished() == []


def test_a_file_another_rank_renamed_in_a_shared_directory_is_not_an_error() -> None:
    # Rank 1 reports first while rank 0 still writes shard_0.tmp; rank 0 renames it before
    # rank 1's upload reads it, then reports: its upload of the whole directory replaces
    # rank 1's.
    tracker = ReportTracker(2, used_dir_names=set())
    [first] = tracker.on_report(_shared(1, 1, {"shard_1": 4, "shard_0.tmp": 0}))
    assert first.shared == ""
    gone = uploaded(1, 1, {"shard_1": 4})
    vanished = VanishedFiles(("shard_0.tmp",), UploadFailedMessage(1, 1, "FileNotFoundError"))
    assert tracker.on_uploaded(UploadedMessage(1, 1, gone.entries, None, 4, 0.1,
                                               vanished=vanished)) == []
    [final] = tracker.on_report(_shared(0, 1, {"shard_0": 4, "shard_1": 4}))
    assert final.rank == 0 and final.shared == "upload"
    tracker.on_uploaded(uploaded(0, 1, {"shard_0": 4, "shard_1": 4}))
    [ready] = tracker.take_ready()
    assert set(ready.entries) == {"shard_0", "shard_1"} and tracker.take_refused() == []
    assert tracker.take_vanished() == []
