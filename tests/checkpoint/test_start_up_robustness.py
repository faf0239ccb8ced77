"""What one odd entry or record leaves in a run never stops every later start, and a
driver killed right after a manifest leaves a checkpoint the next start adopts.

* a partial checkpoint directory holding a FIFO (the recheck lists its top level only);
* an entry the recheck cannot answer for is left in place with a warning;
* an index record whose reference URI no store resolves (an unregistered scheme);
* the metrics history is flushed before the manifest: a manifest of a report beyond
  what the index knows is not refused as planted.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest

from cairn import CheckpointConfig
from cairn._src.checkpoint import manager as manager_module
from cairn._src.checkpoint import reconcile as reconcile_module
from cairn._src.checkpoint.index import CheckpointRecord, RunIndex, read_index, write_index
from cairn._src.checkpoint.manager import CheckpointManager
from cairn._src.checkpoint.manifest import MANIFEST_NAME, Manifest, write_manifest
from cairn._src.checkpoint.views import ReadyCheckpoint
from cairn._src.errors import StorageError
from cairn._src.run.layout import METRICS_DIR
from cairn._src.run.segment_log import SegmentLog
from cairn._src.storage.location import StorageLocation, resolve
from cairn._src.storage.retry import RetryPolicy
from cairn._src.storage.transfer import compute_entries

RETRY = RetryPolicy(max_attempts=1, initial_backoff_s=0.0, max_backoff_s=0.0)


def make_run(tmp_path: Path) -> StorageLocation:
    (tmp_path / "run").mkdir()
    return resolve(str(tmp_path / "run"))


def manager_at(run: StorageLocation, index: RunIndex) -> CheckpointManager:
    return CheckpointManager(run, CheckpointConfig(), RETRY, index,
                             SegmentLog(run.join(METRICS_DIR), RETRY))


def committed(tmp_path: Path, name: str, report_index: int) -> None:
    directory = tmp_path / "run" / name
    directory.mkdir()
    (directory / "w.bin").write_bytes(b"w" * 4)
    location = resolve(str(directory))
    write_manifest(location, Manifest(files=compute_entries(location, ["w.bin"]),
                                      report_index=report_index), RETRY)


# --- item 2: a FIFO in a partial directory ---------------------------------------------


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_in_a_partial_checkpoint_directory_does_not_stop_the_start(
        tmp_path: Path) -> None:
    run = make_run(tmp_path)
    committed(tmp_path, "checkpoint_000001", 1)
    partial = tmp_path / "run" / "checkpoint_000002"
    partial.mkdir()
    os.mkfifo(partial / "pipe")
    index = RunIndex(checkpoints=(CheckpointRecord(dir_name="checkpoint_000001",
                                                   report_index=1),), next_report_index=2)
    manager = manager_at(run, index)
    manager.reconcile()
    assert [r.dir_name for r in manager.index.checkpoints] == ["checkpoint_000001"]
    # Never committed (no manifest at its top level): deleted like any partial upload.
    assert not (partial / "pipe").exists()
    # And again at the next start.
    manager_at(run, index).reconcile()


def test_an_entry_the_recheck_cannot_answer_for_is_left_in_place_with_a_warning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    run = make_run(tmp_path)
    partial = tmp_path / "run" / "checkpoint_000002"
    partial.mkdir()
    (partial / "half.bin").write_bytes(b"h")

    def refuses(*args: Any, **kwargs: Any) -> None:
        raise StorageError("'pipe' is not a regular file")

    monkeypatch.setattr(reconcile_module, "recheck_uncommitted", refuses)
    manager = manager_at(run, RunIndex(next_report_index=2))
    with caplog.at_level(logging.WARNING):
        manager.reconcile()
    assert (partial / "half.bin").exists()
    assert "Leaving checkpoint_000002 in place: 'pipe' is not a regular file" in caplog.text


# --- item 3: a record whose reference URI no store resolves ------------------------------


def foreign_record(report_index: int) -> CheckpointRecord:
    return CheckpointRecord(dir_name=f"checkpoint_{report_index:06d}",
                            report_index=report_index, target_uri="foo://b/x", managed=False)


def with_foreign_record() -> RunIndex:
    """An index of checkpoint_000001 and a record of a scheme this process has not
    registered."""
    return RunIndex(checkpoints=(CheckpointRecord(dir_name="checkpoint_000001",
                                                  report_index=1), foreign_record(2)),
                    next_report_index=3)


def test_reconcile_over_a_record_with_an_unregistered_scheme_returns_the_index(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    run = make_run(tmp_path)
    committed(tmp_path, "checkpoint_000001", 1)
    index = with_foreign_record()
    write_index(run, index, RETRY)
    manager = manager_at(run, index)
    with caplog.at_level(logging.WARNING):
        manager.reconcile()
    assert manager.index == index
    assert "Cannot tell where the data of checkpoint_000002 lies" in caplog.text
    assert manager.names_holding_references() == set()


def test_choose_resume_skips_a_record_whose_view_fails_and_keeps_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    run = make_run(tmp_path)
    committed(tmp_path, "checkpoint_000001", 1)
    index = with_foreign_record()
    manager = manager_at(run, index)
    with caplog.at_level(logging.WARNING):
        chosen = manager.choose_resume()
    assert chosen is not None and chosen.dir_name == "checkpoint_000001"
    # Not resumed from, and not forgotten either: a later start that resolves it may.
    assert [r.dir_name for r in manager.index.checkpoints] == [
        "checkpoint_000001", "checkpoint_000002"]
    assert "Not resuming from checkpoint_000002 (report 2)" in caplog.text


# --- item 4: killed right after the manifest ---------------------------------------------


def test_a_driver_killed_right_after_a_manifest_leaves_a_checkpoint_the_next_start_adopts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Reports 1..19 made no checkpoint, so the index knows of none; report 20 commits.
    run = make_run(tmp_path)
    history = SegmentLog(run.join(METRICS_DIR), RETRY)
    manager = CheckpointManager(run, CheckpointConfig(), RETRY, RunIndex(), history)
    for report in range(1, 21):
        history.append({"report_index": report, "attempt": 0, "metrics": {}})
    name = "checkpoint_000020"
    (tmp_path / "run" / name).mkdir()
    (tmp_path / "run" / name / "w.bin").write_bytes(b"w" * 4)
    entries = compute_entries(run.join(name), ["w.bin"])
    real = manager_module.write_manifest

    class Killed(BaseException):
        pass

    def written_then_killed(*args: Any, **kwargs: Any) -> None:
        real(*args, **kwargs)
        raise Killed()

    monkeypatch.setattr(manager_module, "write_manifest", written_then_killed)
    ready = ReadyCheckpoint(index=20, dir_name=name, metrics={}, entries=entries, ranks=(0,),
                            reference=None, metadata={}, bytes_uploaded=4)
    with pytest.raises(Killed):
        manager.commit(ready, attempt=0)
    assert (tmp_path / "run" / name / MANIFEST_NAME).exists()
    monkeypatch.undo()

    # The next driver: what storage holds, nothing of the dead one's memory.
    after = manager_at(run, read_index(run, RETRY) or RunIndex())
    after.reconcile()
    assert [r.dir_name for r in after.index.checkpoints] == [name]
    assert after.index.next_report_index == 21
