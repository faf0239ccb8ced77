"""The driver's copies of each rank's small files (keep_survivors): which checkpoint's are
kept, for which rank, and what is refused (pure logic; events built by hand)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from cairn._src.controller.driver_copies import DriverCopies
from cairn._src.observe.driver_events import (
    CheckpointCommitted,
    CheckpointSkipped,
    CommitFailed,
    Uploaded,
    WorkerGroupStarted,
)
from cairn._src.wire.messages import UploadedMessage, driver_copy_cost, driver_copy_limit


def uploaded(rank: int, index: int, files: dict[str, Any]) -> Uploaded:
    return Uploaded(UploadedMessage(rank, index, {}, None, 0, 0.0, small_files=files))


def committed(index: int) -> CheckpointCommitted:
    return CheckpointCommitted(None, SimpleNamespace(index=index), None, 0.0,  # type: ignore[arg-type]
                               None)  # type: ignore[arg-type]


def test_the_files_of_the_latest_committed_checkpoint_are_kept_per_rank() -> None:
    copies = DriverCopies()
    copies.notify(uploaded(0, 1, {"rank_0/rank_state.pt": b"a"}))
    copies.notify(uploaded(1, 1, {"rank_1/rank_state.pt": b"b"}))
    assert copies.files(1, 1) == {}  # not committed yet
    copies.notify(committed(1))
    assert copies.files(1, 1) == {"rank_1/rank_state.pt": b"b"}
    assert copies.files(1, 0) == {"rank_0/rank_state.pt": b"a"}
    assert copies.files(0, 1) == {} and copies.files(1, 2) == {}
    # A later report written before the commit of an earlier one: both kept until theirs.
    copies.notify(uploaded(1, 3, {"rank_1/rank_state.pt": b"d"}))
    copies.notify(uploaded(1, 2, {"rank_1/rank_state.pt": b"c"}))
    copies.notify(committed(3))  # report 2 never commits now: dropped with it
    assert copies.files(3, 1) == {"rank_1/rank_state.pt": b"d"} and copies.files(1, 1) == {}
    copies.notify(committed(2))
    assert copies.files(2, 1) == {}  # its files were dropped at the later commit
    # ...and the latest committed checkpoint is still report 3, whose files stay.
    assert copies.files(3, 1) == {"rank_1/rank_state.pt": b"d"}


@pytest.mark.parametrize("end", ["failed", "skipped"])
def test_a_checkpoint_that_does_not_commit_drops_its_files(end: str) -> None:
    copies = DriverCopies()
    copies.notify(uploaded(1, 4, {"rank_1/rank_state.pt": b"x"}))
    copies.notify(CommitFailed(SimpleNamespace(index=4), OSError("store"),  # type: ignore[arg-type]
                               skipped=False) if end == "failed" else CheckpointSkipped(4))
    # Another rank's late part of the same report is not kept either.
    copies.notify(uploaded(0, 4, {"rank_0/rank_state.pt": b"y"}))
    assert copies._pending == {}
    copies.notify(committed(4))  # (a commit result cannot follow; the files are gone)
    assert copies.files(4, 1) == {} and copies.files(4, 0) == {}


def test_a_late_part_of_a_report_older_than_the_committed_one_is_not_kept() -> None:
    copies = DriverCopies()
    copies.notify(committed(6))
    copies.notify(uploaded(1, 5, {"rank_1/rank_state.pt": b"x"}))
    assert copies._pending == {}


@pytest.mark.parametrize("files", [
    {"rank_1/rank_state.pt": "not bytes"},
    {1: b"a name that is no string"},
    {"big": b"x" * (driver_copy_limit(1) + 1)},
])
def test_files_that_are_not_bytes_or_too_large_are_not_kept(
    files: dict[Any, Any], caplog: pytest.LogCaptureFixture,
) -> None:
    copies = DriverCopies()
    copies.notify(uploaded(1, 1, files))
    copies.notify(committed(1))
    assert copies.files(1, 1) == {}
    assert "Rank 1 sent small files that are not kept" in caplog.text


def test_the_driver_holds_each_rank_to_the_limit_of_its_world_size(
    caplog: pytest.LogCaptureFixture,
) -> None:
    copies = DriverCopies()
    copies.notify(WorkerGroupStarted(0, 1024))
    fits = (64 << 10) - driver_copy_cost("a", 0)  # a file's name counts too
    copies.notify(uploaded(1, 1, {"a": b"x" * fits}))
    copies.notify(uploaded(2, 1, {"a": b"x" * (fits + 1)}))
    # Many empty files count against it as well.
    copies.notify(uploaded(3, 1, {f"f{n}": b"" for n in range(2000)}))
    copies.notify(committed(1))
    assert copies.files(1, 1) == {"a": b"x" * fits}
    assert copies.files(1, 2) == copies.files(1, 3) == {}
    assert "Rank 2 sent small files that are not kept (1 files, over 65536 bytes" in (
        caplog.text)
    assert "Rank 3 sent small files that are not kept (2000 files, over 65536 bytes" in (
        caplog.text)


def test_the_limit_per_rank_shrinks_with_the_world() -> None:
    assert driver_copy_limit(1) == driver_copy_limit(64) == 1 << 20
    assert driver_copy_limit(1024) == 64 << 10
    assert driver_copy_limit(0) == 1 << 20


def test_what_a_failed_attempt_left_pending_is_dropped_when_the_next_one_starts() -> None:
    copies = DriverCopies()
    copies.notify(uploaded(0, 5, {"rank_0/rank_state.pt": b"old"}))
    copies.notify(uploaded(1, 5, {"rank_1/rank_state.pt": b"old"}))
    copies.notify(WorkerGroupStarted(1, 2))
    copies.notify(uploaded(0, 5, {"rank_0/rank_state.pt": b"new"}))  # report 5 again
    copies.notify(committed(5))
    assert copies.files(5, 0) == {"rank_0/rank_state.pt": b"new"}
    assert copies.files(5, 1) == {}  # not the failed attempt's
