"""Directory transfers: bad input, retries of transient errors, permanent errors."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from stores import DeniedStore, FailureSchedule, FlakyStore, flaky_location

from cairn._src.errors import (
    CheckpointNotFoundError,
    ConfigError,
    MissingCheckpointFileError,
    NotADirectoryCheckpointError,
    StorageError,
    UnsafePathError,
)
from cairn._src.storage.location import StorageLocation, resolve
from cairn._src.storage.retry import RetryPolicy
from cairn._src.storage.transfer import FileEntry, download_directory, upload_directory

FAST = RetryPolicy(max_attempts=5, initial_backoff_s=0.0, max_backoff_s=0.0)


@pytest.fixture
def src(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    (root / "sub").mkdir(parents=True)
    for i in range(6):
        (root / "sub" / f"f{i}").write_bytes(os.urandom(10_000 + i))
    (root / "top").write_bytes(b"top")
    return root


@pytest.fixture
def dest(new_dict_store: Callable[[], Any]) -> StorageLocation:
    return resolve("bucket/ck", filesystem=new_dict_store())


def test_upload_missing_directory(tmp_path: Path, dest: StorageLocation) -> None:
    with pytest.raises(CheckpointNotFoundError, match=r"'.*/missing' does not exist"):
        upload_directory(str(tmp_path / "missing"), dest)


def test_upload_a_file_instead_of_a_directory(src: Path, dest: StorageLocation) -> None:
    with pytest.raises(NotADirectoryCheckpointError, match="is a file, not a directory"):
        upload_directory(str(src / "top"), dest)


def test_upload_refuses_escaping_names(src: Path, dest: StorageLocation) -> None:
    with pytest.raises(UnsafePathError, match=r"files='\.\./secret' contains a '\.\.'"):
        upload_directory(str(src), dest, files=["top", "../secret"])


def test_upload_refuses_escaping_symlinks(src: Path, dest: StorageLocation, tmp_path: Path) -> None:
    (tmp_path / "secret").write_bytes(b"s")
    os.symlink(tmp_path / "secret", src / "sub" / "link")
    with pytest.raises(UnsafePathError, match="outside the checkpoint directory"):
        upload_directory(str(src), dest)


def test_upload_of_a_missing_listed_file_names_it(src: Path, dest: StorageLocation) -> None:
    with pytest.raises(CheckpointNotFoundError, match=r"upload '.*/src/sub/nope' to"):
        upload_directory(str(src), dest, files=["sub/nope"])


def test_bad_max_workers(src: Path, dest: StorageLocation) -> None:
    with pytest.raises(ConfigError, match=r"max_workers=0 must be an integer >= 1"):
        upload_directory(str(src), dest, max_workers=0)


def test_download_refuses_unsafe_manifest_names(dest: StorageLocation, tmp_path: Path) -> None:
    out = tmp_path / "out"
    files = {"ok": FileEntry(1, "0" * 32), "../../etc/cron.d/x": FileEntry(1, "0" * 32)}
    with pytest.raises(UnsafePathError, match=r"'\.\./\.\./etc/cron\.d/x' contains a '\.\.'"):
        download_directory(dest, str(out), files=files)
    assert not out.exists()  # Refused before anything was written.
    with pytest.raises(UnsafePathError, match="is an absolute path"):
        download_directory(dest, str(out), files={"/etc/passwd": FileEntry(1, "0" * 32)})


def test_download_of_a_missing_file_names_it(
    src: Path, dest: StorageLocation, tmp_path: Path
) -> None:
    entries = upload_directory(str(src), dest)
    entries["sub/gone"] = FileEntry(3, "0" * 32)
    with pytest.raises(MissingCheckpointFileError,
                       match=r"File 'sub/gone' of 'bucket/ck' .* does not exist: it was deleted"):
        download_directory(dest, str(tmp_path / "out"), files=entries)


def test_transient_store_errors_are_retried(
    src: Path, tmp_path: Path, new_dict_store: Callable[[], Any]
) -> None:
    inner = new_dict_store()
    flaky = FlakyStore(inner, every=2)
    loc = resolve("bucket/ck", filesystem=flaky)
    progress: list[int] = []
    entries = upload_directory(str(src), loc, retry=FAST, progress=progress.append)
    download_directory(loc, str(tmp_path / "out"), files=entries, retry=FAST)
    assert flaky.schedule.failures > 0
    assert sorted(inner.objects) == [f"bucket/ck/sub/f{i}" for i in range(6)] + ["bucket/ck/top"]
    # Retried files take their bytes back: the total is still the data size.
    assert sum(progress) == sum(entry.size for entry in entries.values())
    assert (tmp_path / "out" / "top").read_bytes() == b"top"


def test_permanent_errors_are_not_retried(
    src: Path, tmp_path: Path, new_dict_store: Callable[[], Any]
) -> None:
    denied = DeniedStore(new_dict_store())
    loc = resolve("bucket/ck", filesystem=denied)
    entries = upload_directory(str(src), loc, files=["top"])
    with pytest.raises(StorageError, match=r"download .*bucket/ck/top.*permission denied"):
        download_directory(loc, str(tmp_path / "out"), files=entries, retry=FAST)
    assert denied.read_attempts == 1
    assert os.listdir(tmp_path / "out") == []


def test_retries_give_up_and_leave_no_partial_file(src: Path, tmp_path: Path) -> None:
    local = resolve(str(tmp_path / "remote"))
    entries = upload_directory(str(src), local, files=["sub/f1"])
    always = FailureSchedule(every=1, cap=1000)
    flaky = flaky_location(local, always)
    out = tmp_path / "out"
    with pytest.raises(StorageError, match=r"Could not download .*injected transient failure"):
        download_directory(flaky, str(out), files=entries, retry=FAST)
    assert always.failures == FAST.max_attempts
    assert os.listdir(out) == []  # Neither sub/f1 nor a temporary file, nor sub.


def test_failed_download_mid_stream_leaves_no_partial_file(src: Path, tmp_path: Path) -> None:
    local = resolve(str(tmp_path / "remote"))
    entries = upload_directory(str(src), local, files=["sub/f2"])
    # Fail the 3rd call on each path: the stat and the open succeed, the first read fails.
    mid_stream = FailureSchedule(every=3, cap=1000)
    flaky = flaky_location(local, mid_stream)
    out = tmp_path / "out"
    with pytest.raises(StorageError, match="injected transient failure in read"):
        download_directory(flaky, str(out), files=entries, retry=RetryPolicy(max_attempts=1))
    assert os.listdir(out) == []


class _CountingSink:
    """Records the bytes written between flushes (the unit under test is stream_copy)."""

    def __init__(self) -> None:
        self.unflushed = 0
        self.most_unflushed = 0
        self.flushes = 0
        self.data = bytearray()

    def write(self, view: memoryview) -> int:
        self.data += view
        self.unflushed += len(view)
        self.most_unflushed = max(self.most_unflushed, self.unflushed)
        return len(view)

    def flush(self) -> None:
        self.flushes += 1
        self.unflushed = 0


def test_a_remote_write_is_flushed_every_window_so_its_buffered_parts_stay_bounded() -> None:
    import io

    from cairn._src.storage.checksum import new_hasher, stream_copy

    payload = os.urandom(100_000)
    sink = _CountingSink()
    copied = stream_copy(io.BytesIO(payload), sink, memoryview(bytearray(4096)),
                         hasher=new_hasher(), progress=lambda _: None,
                         cancelled=lambda: False, flush_every=16_384)
    assert copied == len(payload) and bytes(sink.data) == payload
    assert sink.most_unflushed == 16_384 and sink.flushes == len(payload) // 16_384


def test_an_s3_upload_larger_than_the_write_window_comes_back_whole(
    tmp_path: Path, s3_uri_factory: Callable[[str], str],
) -> None:
    from cairn.storage import TransferConfig

    # One part in flight at a time: the upload waits for each before it writes the next.
    config = TransferConfig(part_size=5 << 20, max_concurrency=1)
    src = tmp_path / "src"
    src.mkdir()
    (src / "big").write_bytes(os.urandom((10 << 20) + 123))
    location = resolve(s3_uri_factory("window"))
    entries = upload_directory(str(src), location, retry=FAST, transfer=config)
    download_directory(location, str(tmp_path / "out"), files=entries, retry=FAST,
                       transfer=config)
    assert (tmp_path / "out" / "big").read_bytes() == (src / "big").read_bytes()
