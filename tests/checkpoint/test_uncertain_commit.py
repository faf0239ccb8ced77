"""A commit that fails once its manifest write was attempted is uncertain, whatever
failed: the manifest's own write (its directory's fsync after the rename), the flush of
the event log's reference record, or the index write (the metrics history is flushed
before the manifest). The next
attempt settles it (``settle_uncertain``): adopted when its manifest landed, forgotten
when it did not. Never a durable, complete checkpoint the driver called failed and no one
settles, which a later fit() would adopt as committed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cairn import CheckpointConfig
from cairn._src.checkpoint import manager as manager_module
from cairn._src.checkpoint.index import RunIndex, read_index
from cairn._src.checkpoint.manager import CheckpointManager
from cairn._src.checkpoint.manifest import MANIFEST_NAME
from cairn._src.checkpoint.views import ReadyCheckpoint
from cairn._src.errors import StorageError
from cairn._src.run.events import Event
from cairn._src.run.layout import METRICS_DIR, default_checkpoint_dir_name
from cairn._src.run.segment_log import SegmentLog
from cairn._src.storage.checksum import FileEntry, new_hasher
from cairn._src.storage.location import StorageLocation, resolve
from cairn._src.storage.retry import RetryPolicy

RETRY = RetryPolicy(max_attempts=1)


class FailOnce:
    """Raises a storage error at its first call (the outage outlasted the retries)."""

    def __init__(self) -> None:
        self.failed = False

    def __call__(self) -> None:
        if not self.failed:
            self.failed = True
            raise StorageError("the store is down (after its retries)")


class Sink:
    """An event sink whose flush can be made to fail."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.fail = lambda: None

    def emit(self, event: Event) -> None:
        self.events.append(event)

    def flush(self) -> None:
        self.fail()


def entry(data: bytes) -> FileEntry:
    hasher = new_hasher()
    hasher.update(data)
    return FileEntry(len(data), hasher.hexdigest())


def make(tmp_path: Path) -> tuple[StorageLocation, CheckpointManager, SegmentLog, Sink]:
    (tmp_path / "run").mkdir()
    run = resolve(str(tmp_path / "run"))
    history = SegmentLog(run.join(METRICS_DIR), RETRY)
    sink = Sink()
    manager = CheckpointManager(run, CheckpointConfig(), RETRY, RunIndex(), history,
                                events=sink)
    return run, manager, history, sink


def uploaded(tmp_path: Path, index: int) -> ReadyCheckpoint:
    name = default_checkpoint_dir_name(index)
    data = b"weights %d" % index
    (tmp_path / "run" / name).mkdir()
    (tmp_path / "run" / name / "model.bin").write_bytes(data)
    return ReadyCheckpoint(index=index, dir_name=name, metrics={"step": index},
                           entries={"model.bin": entry(data)}, ranks=(0,), reference=None,
                           metadata={}, bytes_uploaded=len(data))


def referenced(tmp_path: Path, index: int) -> ReadyCheckpoint:
    """A checkpoint reported by reference (NO_UPLOAD), its data outside the run."""
    data_dir = tmp_path / "refs" / f"step_{index}"
    data_dir.mkdir(parents=True)
    (data_dir / "model.bin").write_bytes(b"ref %d" % index)
    return ReadyCheckpoint(index=index, dir_name=default_checkpoint_dir_name(index),
                           metrics={"step": index}, entries={}, ranks=(0,),
                           reference=resolve(str(data_dir)), metadata={}, bytes_uploaded=0)


def indexed(run: StorageLocation) -> list[str]:
    index = read_index(run, RETRY)
    return [] if index is None else [r.dir_name for r in index.checkpoints]


def test_a_commit_whose_history_flush_failed_wrote_no_manifest_and_is_not_uncertain(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The history is flushed before the manifest (a later start must know of the report
    # whose manifest it finds): its failure leaves nothing committed, nothing to settle.
    run, manager, history, _ = make(tmp_path)
    monkeypatch.setattr(history, "flush", FailOnce())
    ready = uploaded(tmp_path, 1)
    with pytest.raises(StorageError):
        manager.commit(ready, attempt=1)
    assert not (tmp_path / "run" / ready.dir_name / MANIFEST_NAME).exists()
    assert manager.index.find(ready.dir_name) is None
    assert manager.settle_uncertain() == set()
    assert indexed(run) == []


def test_a_commit_whose_reference_record_could_not_be_flushed_is_adopted(
        tmp_path: Path) -> None:
    run, manager, _, sink = make(tmp_path)
    sink.fail = FailOnce()
    ready = referenced(tmp_path, 1)
    with pytest.raises(StorageError):
        manager.commit(ready, attempt=1)
    assert (tmp_path / "run" / ready.dir_name / MANIFEST_NAME).exists()
    assert manager.settle_uncertain() == {ready.dir_name}
    assert indexed(run) == [ready.dir_name]


def test_a_manifest_write_that_failed_after_its_rename_is_adopted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The manifest is in place, but the fsync of its directory that follows the rename
    # failed: the store may have kept it all.
    run, manager, _, _ = make(tmp_path)
    real = manager_module.write_manifest

    def written_then_failed(*args: Any, **kwargs: Any) -> None:
        real(*args, **kwargs)
        raise StorageError("fsync of the checkpoint directory failed")

    monkeypatch.setattr(manager_module, "write_manifest", written_then_failed)
    ready = uploaded(tmp_path, 1)
    with pytest.raises(StorageError):
        manager.commit(ready, attempt=1)
    monkeypatch.undo()
    assert manager.settle_uncertain() == {ready.dir_name}
    assert indexed(run) == [ready.dir_name]


def test_a_commit_whose_manifest_never_landed_is_forgotten(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run, manager, _, _ = make(tmp_path)

    def refused(*args: Any, **kwargs: Any) -> None:
        raise StorageError("the store is down (after its retries)")

    monkeypatch.setattr(manager_module, "write_manifest", refused)
    ready = uploaded(tmp_path, 1)
    with pytest.raises(StorageError):
        manager.commit(ready, attempt=1)
    monkeypatch.undo()
    assert not (tmp_path / "run" / ready.dir_name / MANIFEST_NAME).exists()
    assert manager.settle_uncertain() == set()
    assert manager.index.find(ready.dir_name) is None
    # The next commit goes on as usual.
    manager.commit(uploaded(tmp_path, 2), attempt=1)
    assert indexed(run) == [default_checkpoint_dir_name(2)]
