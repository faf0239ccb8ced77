"""The same relative path from several ranks, and checkpoint_dir_name without a checkpoint
(pure tracker logic; the real runs are in tests/train/test_shared_files.py)."""

from __future__ import annotations

import os
import time

import pytest

from cairn._src.controller.reports import ReportTracker
from cairn._src.errors import CheckpointCollisionError, CheckpointSkippedError, ReportError
from cairn._src.storage.transfer import FileEntry
from cairn._src.wire.messages import CheckpointIntent, ReportMessage, UploadedMessage


def report(rank: int, index: int, files: dict[str, int] | None = None, *,
           dir_name: str | None = None, named: str | None = None) -> ReportMessage:
    intent = None
    if files is not None:
        intent = CheckpointIntent(dir_name or f"checkpoint_{index:06d}", "SYNC", files=files)
    return ReportMessage(rank, index, {"rank": rank}, intent, time.time(), dir_name=named)


def uploaded(rank: int, index: int, entries: dict[str, FileEntry], *,
             duplicates: dict[str, FileEntry] | None = None) -> UploadedMessage:
    return UploadedMessage(rank, index, entries, None, sum(e.size for e in entries.values()),
                           0.1, duplicates=duplicates or {})


MODEL = FileEntry(4, "aaaa")


def test_identical_copies_are_stored_once_and_the_later_ranks_upload_nothing() -> None:
    tracker = ReportTracker(3, used_dir_names=set())
    [first] = tracker.on_report(report(1, 1, {"model.pt": 4, "r1": 1}))
    assert first.error is None and first.duplicates == ()
    [second] = tracker.on_report(report(0, 1, {"model.pt": 4, "r0": 1}))
    assert second.error is None and second.duplicates == ("model.pt",)
    [third] = tracker.on_report(report(2, 1, {"model.pt": 4}))
    assert third.duplicates == ("model.pt",)
    tracker.on_uploaded(uploaded(1, 1, {"model.pt": MODEL, "r1": FileEntry(1, "1")}))
    tracker.on_uploaded(uploaded(0, 1, {"r0": FileEntry(1, "0")},
                                 duplicates={"model.pt": MODEL}))
    tracker.on_uploaded(uploaded(2, 1, {}, duplicates={"model.pt": MODEL}))
    [ready] = tracker.take_ready()
    assert ready.entries == {"model.pt": MODEL, "r0": FileEntry(1, "0"), "r1": FileEntry(1, "1")}
    assert ready.ranks == (0, 1, 2)
    assert ready.bytes_uploaded == 6  # one copy of model.pt
    assert tracker.take_refused() == []


def test_different_sizes_fail_the_report_naming_both_ranks_the_path_and_the_sizes() -> None:
    # Not refused at the second report: the first rank's listing of a directory it shares
    # with other ranks may be older than their writes. The merge compares what was read.
    tracker = ReportTracker(3, used_dir_names=set())
    tracker.on_report(report(0, 1, {"shared/model.pt": 4}))
    [second] = tracker.on_report(report(2, 1, {"shared/model.pt": 5}))
    assert second.error is None and second.duplicates == ("shared/model.pt",)
    tracker.on_report(report(1, 1))
    tracker.on_uploaded(uploaded(0, 1, {"shared/model.pt": MODEL}))
    tracker.on_uploaded(uploaded(2, 1, {}, duplicates={"shared/model.pt": FileEntry(5, "e")}))
    assert tracker.take_ready() == []
    refused = tracker.take_refused()
    assert [v.rank for v in refused] == [0, 2]
    with pytest.raises(CheckpointCollisionError,
                       match=r"Ranks 0 and 2 both wrote 'shared/model.pt' into the checkpoint of "
                             r"report 1 with different content \(rank 0: 4 bytes, rank 2: 5 "
                             r"bytes\); nothing was "
                             r"overwritten"):
        raise refused[0].error  # type: ignore[misc]
    assert tracker.pending_dir_names() == ["checkpoint_000001"]


def shared(rank: int, index: int, files: dict[str, int], source: str) -> ReportMessage:
    intent = CheckpointIntent(f"checkpoint_{index:06d}", "ASYNC", files=files, source=source)
    return ReportMessage(rank, index, {"rank": rank}, intent, time.time())


def test_ranks_reporting_one_directory_upload_it_again_once_it_is_complete() -> None:
    # Ray Train's pattern: each rank writes shard_<rank> into one directory and reports it.
    # Rank 1 reports first, while rank 0 is still writing its shard (0 bytes), and uploads
    # at once what it sees. Rank 0's go-ahead waits for that upload; then rank 0 lists the
    # directory again and uploads it whole, in place of rank 1's part.
    tracker = ReportTracker(3, used_dir_names=set())
    [first] = tracker.on_report(shared(1, 1, {"shard_0": 0, "shard_1": 39}, "m:1:7"))
    assert (first.rank, first.shared, first.duplicates) == (1, "", ())
    assert tracker.on_report(shared(0, 1, {"shard_0": 39, "shard_1": 39, "t.tmp": 1},
                                    "m:1:7")) == []
    assert tracker.on_report(report(2, 1)) == []  # rank 1's upload has not finished
    early = {"shard_0": FileEntry(0, "e"), "shard_1": FileEntry(39, "1")}
    [final] = tracker.on_uploaded(uploaded(1, 1, early))
    assert (final.rank, final.shared, final.duplicates) == (0, "upload", ())
    assert final.stale == early  # what the first upload wrote, with its entries
    assert tracker.take_ready() == []  # rank 0's upload is still expected
    both = {"shard_0": FileEntry(39, "0"), "shard_1": FileEntry(39, "1")}
    tracker.on_uploaded(uploaded(0, 1, both))
    [ready] = tracker.take_ready()
    assert ready.entries == both and ready.ranks == (0, 1)
    assert tracker.take_refused() == []


def test_the_shared_directory_waits_for_every_rank_and_others_upload_nothing() -> None:
    tracker = ReportTracker(4, used_dir_names=set())
    [first] = tracker.on_report(shared(2, 1, {"shard_2": 1}, "m:1:7"))
    assert first.shared == ""  # nobody else reported the directory yet: it uploads now
    tracker.on_uploaded(uploaded(2, 1, {"shard_2": FileEntry(1, "2")}))
    assert tracker.on_report(shared(3, 1, {"shard_2": 1, "shard_3": 1}, "m:1:7")) == []
    assert tracker.on_report(shared(1, 1, {"shard_1": 1, "shard_2": 1}, "m:1:7")) == []
    # Rank 0 has not reported: it might write into the directory too.
    verdicts = tracker.on_report(report(0, 1))
    assert [(v.rank, v.shared) for v in verdicts] == [(1, "upload"), (3, "skip")]


def test_a_shared_directory_and_a_private_one_with_the_same_path_are_compared() -> None:
    # Rank 0's own directory holds model.pt; ranks 1 and 2 share one holding it too. The
    # shared directory's final upload (rank 1) checks model.pt instead of uploading it.
    tracker = ReportTracker(3, used_dir_names=set())
    tracker.on_report(shared(0, 1, {"model.pt": 4}, "m:1:1"))
    [eager] = tracker.on_report(shared(2, 1, {"model.pt": 4, "shard_2": 1}, "m:1:2"))
    assert eager.duplicates == ("model.pt",)
    assert tracker.on_report(shared(1, 1, {"model.pt": 4, "shard_1": 1}, "m:1:2")) == []
    tracker.on_uploaded(uploaded(0, 1, {"model.pt": MODEL}))
    [final] = tracker.on_uploaded(uploaded(2, 1, {"shard_2": FileEntry(1, "2")},
                                           duplicates={"model.pt": MODEL}))
    assert (final.rank, final.shared, final.duplicates) == (1, "upload", ("model.pt",))
    tracker.on_uploaded(uploaded(1, 1, {"shard_1": FileEntry(1, "1"),
                                        "shard_2": FileEntry(1, "2")},
                                 duplicates={"model.pt": FileEntry(4, "zzzz")}))
    assert tracker.take_ready() == []
    first, *others = tracker.take_refused()
    assert [first.rank] + [v.rank for v in others] == [0, 1, 2]
    with pytest.raises(CheckpointCollisionError, match=r"Ranks 0 and 1 both wrote 'model.pt'.*"
                                                      r"\(different checksums\)"):
        raise first.error  # type: ignore[misc]


def test_same_size_different_checksum_fails_the_report_before_commit() -> None:
    tracker = ReportTracker(2, used_dir_names=set())
    tracker.on_report(report(0, 1, {"model.pt": 4}))
    tracker.on_report(report(1, 1, {"model.pt": 4}))
    tracker.on_uploaded(uploaded(0, 1, {"model.pt": MODEL}))
    tracker.on_uploaded(uploaded(1, 1, {}, duplicates={"model.pt": FileEntry(4, "bbbb")}))
    assert tracker.take_ready() == []
    refused = tracker.take_refused()
    assert [v.rank for v in refused] == [0, 1]
    with pytest.raises(CheckpointCollisionError,
                       match=r"Ranks 0 and 1 both wrote 'model.pt' into the checkpoint of report 1"
                             r" with different content \(different checksums\)"):
        raise refused[0].error  # type: ignore[misc]
    assert tracker.take_refused() == []
    # Not committed, and its directory is left for the cleanup of uncommitted reports.
    assert tracker.take_ready() == []
    assert tracker.pending_dir_names() == ["checkpoint_000001"]
    # A late part of the failed report is refused too.
    [late] = tracker.on_report(report(0, 1, {"other": 1}))
    assert isinstance(late.error, CheckpointCollisionError)


def test_a_missing_checksum_for_a_skipped_path_is_a_collision_not_a_commit() -> None:
    tracker = ReportTracker(2, used_dir_names=set())
    tracker.on_report(report(0, 1, {"model.pt": 4}))
    tracker.on_report(report(1, 1, {"model.pt": 4}))
    tracker.on_uploaded(uploaded(0, 1, {"model.pt": MODEL}))
    tracker.on_uploaded(uploaded(1, 1, {}))
    assert tracker.take_ready() == []
    [first, _] = tracker.take_refused()
    assert isinstance(first.error, CheckpointCollisionError)


def test_dir_name_without_a_checkpoint_is_accepted_when_it_matches() -> None:
    tracker = ReportTracker(2, used_dir_names=set())
    assert tracker.on_report(report(1, 1, named="epoch_1")) == []
    [verdict] = tracker.on_report(report(0, 1, {"a": 1}, dir_name="epoch_1"))
    assert verdict.error is None
    tracker.on_uploaded(uploaded(0, 1, {"a": FileEntry(1, "a")}))
    [ready] = tracker.take_ready()
    assert ready.dir_name == "epoch_1" and ready.ranks == (0,)


def test_dir_name_without_a_checkpoint_that_differs_is_refused_either_order() -> None:
    tracker = ReportTracker(2, used_dir_names=set())
    tracker.on_report(report(0, 1, {"a": 1}, dir_name="epoch_1"))
    verdicts = tracker.on_report(report(1, 1, named="epoch_2"))
    assert [v.rank for v in verdicts] == [1, 0]
    with pytest.raises(ReportError, match=r"Ranks disagree on checkpoint_dir_name for report 1: "
                                          r"rank 0 gave 'epoch_1', rank 1 gave 'epoch_2'"):
        raise verdicts[0].error  # type: ignore[misc]

    tracker = ReportTracker(2, used_dir_names=set())
    assert tracker.on_report(report(1, 1, named="epoch_2")) == []
    verdicts = tracker.on_report(report(0, 1, {"a": 1}, dir_name="epoch_1"))
    assert [v.rank for v in verdicts] == [0, 1]
    with pytest.raises(ReportError, match=r"rank 1 gave 'epoch_2' \(without a checkpoint\), "
                                          r"rank 0 gave 'epoch_1'"):
        raise verdicts[0].error  # type: ignore[misc]


def test_dir_name_when_no_rank_passes_a_checkpoint_saves_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tracker = ReportTracker(2, used_dir_names=set())
    tracker.on_report(report(0, 1, named="x"))
    tracker.on_report(report(1, 1, named="x"))
    assert tracker.take_ready() == [] and tracker.pending_dir_names() == []
    assert "gave checkpoint_dir_name ['x'] without a checkpoint" in caplog.text


def test_the_second_upload_of_a_shared_directory_skips_only_what_is_unchanged(
    tmp_path: os.PathLike[str],
) -> None:
    from cairn._src.storage.location import resolve
    from cairn._src.storage.retry import RetryPolicy
    from cairn._src.storage.transfer import compute_entries
    from cairn._src.worker.session import unchanged_files

    directory = os.fspath(tmp_path)
    for name, data in {"same": b"abc", "rewritten": b"xyz", "grown": b"12",
                       "theirs": b"t", "new": b"n"}.items():
        with open(os.path.join(directory, name), "wb") as f:
            f.write(data)
    earlier = compute_entries(resolve(directory), ["same", "rewritten", "grown", "theirs"])
    earlier["gone"] = FileEntry(1, "0" * 32)
    for name, data in {"rewritten": b"xyZ", "grown": b"123"}.items():  # same size, then not
        with open(os.path.join(directory, name), "wb") as f:
            f.write(data)
    files = {name: os.path.getsize(os.path.join(directory, name))
             for name in os.listdir(directory)}
    kept = unchanged_files(directory, files, earlier, {"theirs"}, RetryPolicy())
    assert kept == {"same": earlier["same"]}


@pytest.mark.parametrize("late_rank", [False, True])
def test_a_skipped_report_refuses_the_ranks_held_for_their_shared_directory(
    late_rank: bool,
) -> None:
    # upload_failure_policy="skip": rank 1 reported the directory first and its upload
    # failed while rank 0, which reported it too, was held (for that upload, or for a
    # rank that has not reported yet). Nothing would release rank 0 once the report is
    # dropped: the skip refuses it.
    tracker = ReportTracker(3, used_dir_names=set())
    [first] = tracker.on_report(shared(1, 1, {"shard_1": 1}, "m:1:7"))
    assert first.error is None
    assert tracker.on_report(shared(0, 1, {"shard_0": 1, "shard_1": 1}, "m:1:7")) == []
    if not late_rank:
        assert tracker.on_report(report(2, 1)) == []  # rank 1's upload has not finished
    pending, refusals = tracker.skip(1, "The checkpoint of report 1 was skipped: rank 1")
    assert pending is not None and pending.held == {0}
    assert [(v.rank, v.index, type(v.error)) for v in refusals] == [
        (0, 1, CheckpointSkippedError)]
    assert str(refusals[0].error) == "The checkpoint of report 1 was skipped: rank 1"
    if late_rank:
        # Its part comes after the skip: refused at once.
        [late] = tracker.on_report(shared(2, 1, {"shard_1": 1, "shard_2": 1}, "m:1:7"))
        assert (late.rank, type(late.error)) == (2, CheckpointSkippedError)
    # Another rank's upload of it failing too: nobody is left to refuse.
    assert tracker.skip(1, "again") == (None, [])
