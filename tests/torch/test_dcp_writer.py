"""cairn.torch.FileSystemWriter: DCP's writer that checksums as it writes, and the commit
that takes those checksums instead of reading a NO_UPLOAD checkpoint again."""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
import torch_workloads

import cairn
from cairn import ScalingConfig
from cairn._src.errors import UnsafePathError
from cairn._src.storage import written as written_module
from cairn._src.storage.checksum import WrittenFile
from cairn._src.storage.location import resolve
from cairn._src.storage.retry import RetryPolicy
from cairn._src.storage.transfer import compute_entries
from cairn._src.storage.written import entries_of
from cairn.torch import FileSystemWriter, TorchTrainer

RETRY = RetryPolicy(max_attempts=1)
RunConfigFactory = Callable[..., cairn.RunConfig]


def state() -> dict[str, Any]:
    torch.manual_seed(0)
    return {"w": torch.randn(256, 64), "b": torch.randn(64), "step": 3}


def hashed(directory: str) -> dict[str, Any]:
    names = [str(p.relative_to(directory)).replace(os.sep, "/")
             for p in Path(directory).rglob("*") if p.is_file()]
    return compute_entries(resolve(directory), names, retry=RETRY)


def test_the_writer_records_what_hashing_the_files_gives(tmp_path: Path) -> None:
    path = str(tmp_path / "step_3")
    writer = FileSystemWriter(path)
    dcp.save(state(), storage_writer=writer)
    checkpoint = writer.checkpoint()
    assert isinstance(checkpoint, cairn.Checkpoint) and checkpoint.path == path
    records = checkpoint._written
    # Every file DCP wrote, the metadata too (written under a temporary name, renamed).
    assert ".metadata" in records and len(records) >= 2
    assert {rel: record.entry for rel, record in records.items()} == hashed(path)
    loaded = {"w": torch.zeros(256, 64), "b": torch.zeros(64), "step": 0}
    dcp.load(loaded, checkpoint_id=path)
    assert torch.equal(loaded["w"], state()["w"]) and loaded["step"] == 3


def test_a_new_save_forgets_the_records_of_the_one_before(tmp_path: Path) -> None:
    writer = FileSystemWriter(tmp_path / "a")
    dcp.save(state(), storage_writer=writer)
    dcp.save(state(), checkpoint_id=tmp_path / "b", storage_writer=writer)
    checkpoint = writer.checkpoint()
    assert checkpoint.path == str(tmp_path / "b")
    assert set(checkpoint._written) == set(hashed(str(tmp_path / "b")))
    writer.reset(tmp_path / "c")
    assert writer.checkpoint()._written == {}


def test_a_stream_that_seeks_records_nothing(tmp_path: Path) -> None:
    writer = FileSystemWriter(tmp_path)
    with writer.fs.create_stream(tmp_path / "f", "wb") as stream:
        stream.write(b"abcd")
        stream.seek(0)
        stream.write(b"x")
    with writer.fs.create_stream(tmp_path / "g", "wb") as stream:
        stream.write(b"abcd")
    assert set(writer.checkpoint()._written) == {"g"}


def test_a_pickled_writer_starts_without_records(tmp_path: Path) -> None:
    # DCP's process mode pickles the writer into its checkpoint process.
    writer = FileSystemWriter(tmp_path / "a")
    dcp.save(state(), storage_writer=writer)
    copy = pickle.loads(pickle.dumps(writer))
    assert copy.checkpoint()._written == {} and copy.path == writer.path
    dcp.save(state(), checkpoint_id=tmp_path / "b", storage_writer=copy)
    assert set(copy.checkpoint()._written) == set(hashed(str(tmp_path / "b")))


def test_the_commit_takes_records_of_unchanged_files_and_hashes_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "ckpt")
    writer = FileSystemWriter(path)
    dcp.save(state(), storage_writer=writer)
    records = writer.checkpoint()._written
    asked: list[list[str]] = []

    def spy(loc: Any, files: Any, **kwargs: Any) -> Any:
        asked.append(sorted(files))
        return compute_entries(loc, files, **kwargs)

    monkeypatch.setattr(written_module, "compute_entries", spy)
    truth = hashed(path)
    assert entries_of(resolve(path), truth, records, retry=RETRY) == truth
    assert asked == [[]]
    # A file rewritten since (new content, new time), one the writer never saw, and a
    # record that claims another size: each is read and hashed.
    data = next(rel for rel in truth if rel != ".metadata")
    with open(os.path.join(path, data), "r+b") as f:
        f.write(b"\0" * 8)
    os.utime(os.path.join(path, data), ns=(1, 1))
    Path(path, "extra.txt").write_text("extra")
    claimed = {rel: record for rel, record in records.items()}
    meta = claimed[".metadata"]
    claimed[".metadata"] = WrittenFile(meta.entry.__class__(meta.entry.size + 1,
                                                            meta.entry.checksum),
                                       meta.mtime_ns, meta.inode)
    asked.clear()
    truth = hashed(path)
    assert entries_of(resolve(path), truth, claimed, retry=RETRY) == truth
    assert asked == [sorted([data, "extra.txt", ".metadata"])]


def test_a_recorded_file_replaced_by_a_link_is_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "ckpt")
    writer = FileSystemWriter(path)
    dcp.save(state(), storage_writer=writer)
    records = writer.checkpoint()._written
    outside = tmp_path / "outside"
    os.replace(os.path.join(path, ".metadata"), outside)
    os.symlink(outside, os.path.join(path, ".metadata"))
    with pytest.raises(UnsafePathError, match=r"\.metadata.*regular files only"):
        entries_of(resolve(path), records, records, retry=RETRY)


@pytest.mark.parametrize("route", ["no_upload", "upload_fn"])
def test_a_dcp_checkpoint_registered_by_reference_commits_without_being_read_again(
    route: str, run_config: RunConfigFactory, scratch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The controller runs in this process: what it hashes goes through this spy.
    asked: list[list[str]] = []

    def spy(loc: Any, files: Any, **kwargs: Any) -> Any:
        asked.append(sorted(files))
        return compute_entries(loc, files, **kwargs)

    monkeypatch.setattr(written_module, "compute_entries", spy)
    result = TorchTrainer(
        torch_workloads.dcp_save_by_reference,
        train_loop_config={"root": os.path.join(scratch, "dcp"), "route": route},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=run_config(),
    ).fit()
    assert result.error is None
    assert result.checkpoint is not None
    directory = os.path.join(scratch, "dcp", "step_2")
    assert result.checkpoint.path == directory
    files = hashed(directory)
    assert {rel for rel in files if rel.endswith(".distcp")} == {"__0_0.distcp",
                                                                   "__1_0.distcp"}
    assert asked == [[], []], "both commits took every entry from the ranks' writers"
    assert result.checkpoint.get_metadata() == {}
    with result.checkpoint.as_directory() as restored:  # verified against the manifest
        loaded = {"w": torch.zeros(128, 32), "step": 0}
        dcp.load(loaded, checkpoint_id=restored)
    assert loaded["step"] == 2


def test_the_save_fsyncs_its_directories_after_the_metadata_rename(
        tmp_path: Path, fsyncs: list[str]) -> None:
    # DCP fsyncs each file and .metadata.tmp, never a directory: the files' entries, the
    # rename to .metadata and the new directories themselves could be lost in a power
    # loss after Cairn's manifest (fsynced) names them.
    path = tmp_path / "run-dcp" / "attempt_0" / "step_3"
    dcp.save(state(), storage_writer=FileSystemWriter(str(path)))
    metadata = fsyncs.index(str(path / ".metadata.tmp"))
    after = fsyncs[metadata + 1:]
    for directory in (path, path.parent, path.parent.parent, tmp_path):
        assert str(directory) in after, (directory, fsyncs)
    assert after.index(str(path)) < after.index(str(path.parent)) \
        < after.index(str(tmp_path))


def test_every_file_is_fsynced_with_all_its_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # DCP fsyncs .metadata.tmp right after pickling into it, without a flush: the metadata
    # sat in the stream's buffer, and the fsync covered an empty file.
    sizes: dict[str, int] = {}
    original = os.fsync

    def recording(descriptor: int) -> None:
        sizes[os.readlink(f"/proc/self/fd/{descriptor}")] = os.fstat(descriptor).st_size
        original(descriptor)

    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("reads /proc/self/fd")
    monkeypatch.setattr(os, "fsync", recording)
    path = tmp_path / "s"
    dcp.save(state(), storage_writer=FileSystemWriter(str(path)))
    assert sizes[str(path / ".metadata.tmp")] == (path / ".metadata").stat().st_size > 0
    data = list(path.glob("*.distcp"))
    assert data and all(sizes[str(f)] == f.stat().st_size for f in data)


def test_without_sync_files_the_save_fsyncs_nothing(tmp_path: Path, fsyncs: list[str]) -> None:
    dcp.save(state(), storage_writer=FileSystemWriter(str(tmp_path / "s"), sync_files=False))
    assert fsyncs == []
