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
