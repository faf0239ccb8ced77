"""Committed means durable: the fsyncs a commit makes on local storage, in their order, and
the option that turns them off (``RunConfig.storage_fsync``)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

import cairn
from cairn._src.checkpoint.index import INDEX_NAME, RunIndex, read_index, write_index
from cairn._src.checkpoint.manifest import MANIFEST_NAME, Manifest, read_manifest, write_manifest
from cairn._src.errors import ConfigError
from cairn._src.storage.checksum import FileEntry
from cairn._src.storage.durability import sync_uploaded, write_durably
from cairn._src.storage.location import resolve
from cairn._src.storage.options import StorageOptions


def test_sync_uploaded_fsyncs_files_then_their_directories_deepest_first(
    tmp_path: Path, fsyncs: list[str]
) -> None:
    root = tmp_path / "run" / "checkpoint_000001"
    (root / "a" / "b").mkdir(parents=True)
    for rel in ("top.pt", "a/one.pt", "a/b/two.pt"):
        (root / rel).write_bytes(b"x")
    sync_uploaded(str(root), ["a/b/two.pt", "top.pt", "a/one.pt"])
    assert fsyncs == [str(root / "a" / "b" / "two.pt"), str(root / "a" / "one.pt"),
                      str(root / "top.pt"), str(root / "a" / "b"), str(root / "a"),
                      str(root), str(tmp_path / "run")]


def test_write_durably_fsyncs_the_temporary_then_the_directory_after_the_rename(
    tmp_path: Path, fsyncs: list[str]
) -> None:
    target = tmp_path / "index.json"
    target.write_bytes(b"old")
    write_durably(str(target), b"new")
    assert target.read_bytes() == b"new"
    assert len(fsyncs) == 2
    assert fsyncs[0].startswith(f"{target}.cairn-tmp-")  # the data, before its rename
    assert fsyncs[1] == str(tmp_path)  # the rename itself
    assert sorted(os.listdir(tmp_path)) == ["index.json"]


def test_manifest_and_index_are_written_durably_unless_turned_off(
    tmp_path: Path, fsyncs: list[str]
) -> None:
    run = resolve(str(tmp_path))
    manifest = Manifest(files={"a.pt": FileEntry(1, "0" * 32)}, metadata={}, report_index=1,
                        metrics={}, ranks=(0,))
    checkpoint = run.join("checkpoint_000001")
    write_manifest(checkpoint, manifest)
    write_index(run, RunIndex(), cairn.RetryPolicy())
    assert [os.path.basename(p).split(".cairn-tmp-")[0] for p in fsyncs] == [
        MANIFEST_NAME, "checkpoint_000001", INDEX_NAME, os.path.basename(tmp_path)]
    fsyncs.clear()
    write_manifest(checkpoint, manifest, durable=False)
    write_index(run, RunIndex(), cairn.RetryPolicy(), durable=False)
    assert fsyncs == []
    assert read_manifest(checkpoint) == manifest
    assert read_index(run, cairn.RetryPolicy()) is not None


def test_storage_fsync_must_be_a_bool() -> None:
    with pytest.raises(ConfigError, match=r"RunConfig.storage_fsync='no' must be True \(the "
                                          r"default.*or False \(tmpfs or scratch"):
        cairn.RunConfig(storage_fsync="no")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"StorageOptions.fsync=1 must be True"):
        StorageOptions(fsync=1)  # type: ignore[arg-type]
    assert cairn.RunConfig().storage_options().fsync is True
    assert cairn.RunConfig(storage_fsync=False).storage_options().fsync is False


def test_a_file_system_that_cannot_sync_a_directory_syncs_its_files_still(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "a.pt").write_bytes(b"x")
    synced: list[str] = []

    def refusing(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if os.path.isdir(path):
            raise OSError(errno.EINVAL, "Invalid argument")
        synced.append(path)

    monkeypatch.setattr(os, "fsync", refusing)
    sync_uploaded(str(tmp_path / "checkpoint"), ["a.pt"])
    assert synced == [str(tmp_path / "checkpoint" / "a.pt")]

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(OSError, match="Input/output error"):
        sync_uploaded(str(tmp_path / "checkpoint"), ["a.pt"])


@pytest.mark.parametrize("durable", [True, False])
def test_retention_removes_the_manifest_durably_before_the_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durable: bool
) -> None:
    # A machine that crashes while a checkpoint is deleted must not come back with its
    # manifest naming files that are gone: the unlinked manifest's directory is fsynced
    # before the first data file goes (RunConfig(storage_fsync=True)).
    from cairn._src.checkpoint import manager as manager_module
    from cairn._src.checkpoint.index import CheckpointRecord
    from cairn._src.checkpoint.manager import CheckpointManager
    from cairn._src.run.segment_log import SegmentLog
    from cairn._src.storage.transfer import compute_entries

    run = resolve(str(tmp_path / "run"))
    checkpoint = tmp_path / "run" / "checkpoint_000001"
    checkpoint.mkdir(parents=True)
    (checkpoint / "a.bin").write_bytes(b"a")
    write_manifest(run.join("checkpoint_000001"), Manifest(
        files=compute_entries(run.join("checkpoint_000001"), ["a.bin"]), report_index=1))
    record = CheckpointRecord(dir_name="checkpoint_000001", report_index=1)
    index = RunIndex(checkpoints=(record,), next_report_index=2)
    manager = CheckpointManager(run, cairn.CheckpointConfig(), cairn.RetryPolicy(), index,
                                SegmentLog(run.join("metrics"), cairn.RetryPolicy()),
                                fsync=durable)
    calls: list[tuple[str, ...]] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        calls.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"),
                      str((checkpoint / MANIFEST_NAME).exists()),
                      str((checkpoint / "a.bin").exists())))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    real_delete_dir = manager_module.delete_dir
    monkeypatch.setattr(manager_module, "delete_dir", lambda loc, retry: (
        calls.append(("delete_dir", loc.path)), real_delete_dir(loc, retry))[1])

    assert manager.delete_owned(record, delete_references=False)
    assert not checkpoint.exists()
    if durable:
        # The manifest gone, its data still there, then the data.
        assert calls == [("fsync", str(checkpoint), "False", "True"),
                         ("delete_dir", run.join("checkpoint_000001").path)]
    else:
        assert calls == [("delete_dir", run.join("checkpoint_000001").path)]
