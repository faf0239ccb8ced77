"""A snapshot is serialized once, straight into its destination, hashed as it is written:
local files (fsynced unless turned off) and remote streams alike; a path another rank
writes is hashed only."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest
import torch

from cairn._src.checkpoint.checkpoint import Checkpoint
from cairn._src.storage.checksum import new_hasher
from cairn._src.storage.location import StorageLocation, resolve
from cairn._src.storage.options import StorageOptions
from cairn._src.torch.snapshot import _buffers, _Writer
from cairn._src.torch.snapshot_buffers import copy_state
from cairn._src.wire.messages import ProceedMessage
from cairn._src.worker import direct_write
from cairn._src.worker.direct_write import direct_writer, write_direct
from cairn._src.worker.report_handle import ReportHandle
from cairn._src.worker.upload_job import UploadJob

FILES = {"state.pt": {"w": torch.arange(1000.0), "step": 4},
         "rank_0/rank_state.pt": {"rng": torch.ones(3)}}


def job_for(files: dict[str, object], tmp_path: Path) -> tuple[UploadJob, _Writer]:
    buffer_set = _buffers.acquire()
    copied = copy_state(files, buffer_set)
    writer = _Writer(copied, buffer_set)
    job = UploadJob(index=1, dir_name="checkpoint_000001",
                    checkpoint=Checkpoint.from_directory(str(tmp_path)),
                    files=dict.fromkeys(files, 0), upload_fn=None, delete_local=True,
                    handle=ReportHandle(1, has_checkpoint=True), metadata={}, write=writer)
    return job, writer


def read(destination: StorageLocation, rel: str) -> bytes:
    with destination.filesystem.open_input_stream(destination.join(rel).path) as stream:
        return bytes(stream.read())


@pytest.mark.parametrize("where", ["local", "memory"])
def test_snapshot_files_are_serialized_into_the_destination_with_their_checksums(
    where: str, tmp_path: Path, fsyncs: list[str]
) -> None:
    destination = (resolve(str(tmp_path / "run" / "checkpoint_000001")) if where == "local"
                   else resolve(f"memory://direct-{time.time_ns()}/run/checkpoint_000001"))
    job, writer = job_for(FILES, tmp_path / "private")
    assert direct_writer(job, local_tier=None) is writer
    assert direct_writer(job, local_tier=object()) is None  # a local tier keeps a copy
    message = write_direct(job, writer, ProceedMessage(1), destination, 0, time.perf_counter(),
                           options=StorageOptions())
    assert sorted(message.entries) == sorted(FILES)
    for rel, entry in message.entries.items():
        data = read(destination, rel)
        hasher = new_hasher()
        hasher.update(data)
        assert (entry.size, entry.checksum) == (len(data), hasher.hexdigest())
        loaded = torch.load(destination.join(rel).path if where == "local" else
                            io.BytesIO(data))
        assert str(loaded) == str(FILES[rel])
    assert message.bytes_written == sum(e.size for e in message.entries.values())
    if where == "local":
        root = str(tmp_path / "run" / "checkpoint_000001")
        assert fsyncs == [f"{root}/rank_0/rank_state.pt", f"{root}/state.pt",
                          f"{root}/rank_0", root, str(tmp_path / "run")]
    else:
        assert fsyncs == []


def test_a_path_another_rank_writes_is_hashed_not_written_and_fsync_can_be_off(
    tmp_path: Path, fsyncs: list[str]
) -> None:
    destination = resolve(str(tmp_path / "checkpoint_000001"))
    job, writer = job_for(FILES, tmp_path / "private")
    message = write_direct(job, writer, ProceedMessage(1, duplicates=("state.pt",)),
                           destination, 0, time.perf_counter(),
                           options=StorageOptions(fsync=False))
    assert sorted(message.entries) == ["rank_0/rank_state.pt"]
    assert sorted(message.duplicates) == ["state.pt"]
    assert not (tmp_path / "checkpoint_000001" / "state.pt").exists()
    assert fsyncs == []


class Keeper:
    """A kept rank's memory copies: takes every writer (or none)."""

    def __init__(self, takes: bool) -> None:
        self.takes = takes

    def hold(self, report_index: int, writer: object, entries: object) -> bool:
        return self.takes


@pytest.mark.parametrize(("takes", "limit", "sent"), [
    (True, 1 << 20, ["rank_0/rank_state.pt", "state.pt"]),
    (True, 4096, ["rank_0/rank_state.pt"]),  # the smallest first, up to the limit
    (True, 0, []),
    (False, 1 << 20, []),  # not kept in memory: keep_survivors is off
])
def test_a_kept_snapshot_sends_its_smallest_files_to_the_driver(
    tmp_path: Path, takes: bool, limit: int, sent: list[str],
) -> None:
    destination = resolve(str(tmp_path / "checkpoint_000001"))
    job, writer = job_for(FILES, tmp_path / "private")
    message = write_direct(job, writer, ProceedMessage(1), destination, 0, time.perf_counter(),
                           options=StorageOptions(fsync=False), keep=Keeper(takes),
                           small_limit=limit)
    assert sorted(message.small_files) == sent
    for rel, data in message.small_files.items():
        assert data == read(destination, rel)
    if takes:
        writer.close()


def test_small_files_that_fail_to_serialize_again_leave_the_upload_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    destination = resolve(str(tmp_path / "checkpoint_000001"))
    job, writer = job_for(FILES, tmp_path / "private")

    def failing(*args: object) -> dict[str, bytes]:
        raise MemoryError("no room for a second serialization")

    monkeypatch.setattr(direct_write, "small_files", failing)
    message = write_direct(job, writer, ProceedMessage(1), destination, 0, time.perf_counter(),
                           options=StorageOptions(fsync=False), keep=Keeper(True),
                           small_limit=1 << 20)
    assert sorted(message.entries) == sorted(FILES) and message.small_files == {}
    writer.close()


def test_a_sink_that_fails_mid_file_raises_and_leaves_the_process_alive() -> None:
    # A peer that goes away while a kept rank serializes its copy to it (BrokenPipe, or
    # the offered file removed): the error reaches the caller and the process lives on;
    # torch's zip writer left unfinished used to end it (SIGABRT) once freed. Run in a
    # child process, so that an abort fails this test and not the suite.
    import subprocess
    import sys
    import textwrap

    child = textwrap.dedent("""
        import gc
        import torch
        from cairn._src.torch.snapshot import serialize

        class Breaks:
            def __init__(self):
                self.n = 0
            def writable(self):
                return True
            def flush(self):
                pass
            def write(self, data):
                self.n += len(memoryview(data).cast("B"))
                if self.n > 1 << 20:
                    raise BrokenPipeError(32, "Broken pipe")
                return len(memoryview(data).cast("B"))

        try:
            serialize({"w": torch.ones(1 << 20)}, Breaks())
        except BrokenPipeError as exc:
            print("raised", exc.errno, flush=True)
        gc.collect()
        print("alive", flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                          timeout=120)
    assert (done.returncode, done.stdout.split()) == (0, ["raised", "32", "alive"]), \
        done.stderr[-2000:]
