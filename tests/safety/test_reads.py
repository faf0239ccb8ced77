"""Reads are bounded and typed: no link followed, no FIFO or device read, no read past the
manifest's size, on verification, restore and read-back (issue 10, items 6, 9 and 10).

Every call that could block if the reader were wrong runs through :func:`bounded`, which
fails the test instead of hanging it, and FIFOs are released on teardown.
"""

from __future__ import annotations

import io
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from guards import bounded, release_fifos

from cairn import Checkpoint, ChecksumMismatchError, ManifestError, StorageError, UnsafePathError
from cairn._src.checkpoint.manifest import MANIFEST_NAME, Manifest, read_manifest, write_manifest
from cairn._src.errors import (
    CheckpointDamagedError,
    MissingCheckpointFileError,
    NotARegularFileError,
)
from cairn._src.run.segment_log import read_log
from cairn._src.storage.checksum import new_hasher, stream_copy
from cairn._src.storage.fileio import list_files, read_bytes
from cairn._src.storage.location import StorageLocation, resolve
from cairn._src.storage.retry import RetryPolicy
from cairn._src.storage.transfer import (
    FileEntry,
    compute_entries,
    download_directory,
    upload_directory,
    verify_directory,
)

RETRY = RetryPolicy(max_attempts=1)


@pytest.fixture
def fifos() -> Iterator[list[str]]:
    """FIFOs a test makes (append their paths); released on teardown."""
    made: list[str] = []
    yield made
    release_fifos(made)


def make_fifo(path: Path, fifos: list[str]) -> None:
    if path.exists() or path.is_symlink():
        path.unlink()
    os.mkfifo(path)
    fifos.append(str(path))


def committed(tmp_path: Path, files: dict[str, bytes]) -> tuple[StorageLocation, Manifest]:
    """A committed local checkpoint of ``files`` at ``tmp_path / 'ckpt'``."""
    src = tmp_path / "src"
    for name, data in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(data)
    location = resolve(str(tmp_path / "ckpt"))
    entries = upload_directory(str(src), location)
    manifest = Manifest(files=entries, report_index=1)
    write_manifest(location, manifest)
    return location, manifest


FILES = {"model.bin": b"weights!", "sub/opt.bin": b"moments"}


@pytest.fixture
def checkpoint(tmp_path: Path) -> tuple[StorageLocation, Manifest]:
    return committed(tmp_path, FILES)


def every_reader(location: StorageLocation, manifest: Manifest, out: Path) -> list[
        Callable[[], object]]:
    ckpt = Checkpoint(location.path)

    def as_directory() -> None:
        with ckpt.as_directory():
            pass

    return [
        lambda: verify_directory(location, manifest.files, retry=RETRY),
        ckpt.verify,
        lambda: ckpt.to_directory(str(out / "restored")),
        as_directory,
        lambda: download_directory(location, str(out / "downloaded"), files=manifest.files),
    ]


@pytest.mark.parametrize("reader", range(5), ids=["verify_directory", "verify",
                                                   "to_directory", "as_directory", "download"])
@pytest.mark.parametrize("damage", ["dev_zero", "fifo", "directory"])
def test_a_file_that_is_not_regular_is_damage_and_never_read(
    checkpoint: tuple[StorageLocation, Manifest], tmp_path: Path, fifos: list[str],
    damage: str, reader: int,
) -> None:
    location, manifest = checkpoint
    target = tmp_path / "ckpt" / "model.bin"
    target.unlink()
    if damage == "dev_zero":
        target.symlink_to("/dev/zero")
        kind = "a symbolic link"
    elif damage == "fifo":
        make_fifo(target, fifos)
        kind = "a FIFO"
    else:
        target.mkdir()
        kind = "a directory"
    call = every_reader(location, manifest, tmp_path)[reader]
    with pytest.raises(NotARegularFileError,
                       match=rf"file 'model\.bin' is {kind}; Cairn reads regular files only, so "
                             r"it neither follows links nor reads FIFOs or devices"):
        bounded(call)
    assert issubclass(NotARegularFileError, ChecksumMismatchError)
    assert not (tmp_path / "restored" / "model.bin").exists()


def test_a_linked_directory_on_the_way_is_refused_even_with_valid_data(
    checkpoint: tuple[StorageLocation, Manifest], tmp_path: Path
) -> None:
    location, manifest = checkpoint
    # The same bytes elsewhere: the checksums would pass, but the read would leave the
    # checkpoint directory.
    elsewhere = tmp_path / "elsewhere"
    (tmp_path / "ckpt" / "sub").rename(elsewhere)
    (tmp_path / "ckpt" / "sub").symlink_to(elsewhere)
    with pytest.raises(NotARegularFileError,
                       match=r"the directory 'sub' on the way to file 'sub/opt\.bin' is a "
                             r"symbolic link"):
        bounded(lambda: verify_directory(location, manifest.files, retry=RETRY))


def test_a_longer_file_is_a_mismatch_found_without_reading_it(
    checkpoint: tuple[StorageLocation, Manifest], tmp_path: Path
) -> None:
    location, manifest = checkpoint
    # 1 TiB, sparse: reading it would never finish within the test.
    with open(tmp_path / "ckpt" / "model.bin", "r+b") as f:
        f.truncate(1 << 40)
    with pytest.raises(ChecksumMismatchError,
                       match=r"File 'model\.bin' of .* is corrupt: expected 8 bytes, storage "
                             r"holds 1099511627776\."):
        bounded(lambda: verify_directory(location, manifest.files, retry=RETRY))
    with pytest.raises(ChecksumMismatchError, match="expected 8 bytes, storage holds"):
        bounded(lambda: Checkpoint(location.path).to_directory(str(tmp_path / "out")))


def test_a_file_where_the_manifest_has_a_directory_is_a_missing_file(
    checkpoint: tuple[StorageLocation, Manifest], tmp_path: Path
) -> None:
    location, manifest = checkpoint
    (tmp_path / "ckpt" / "sub" / "opt.bin").unlink()
    (tmp_path / "ckpt" / "sub").rmdir()
    (tmp_path / "ckpt" / "sub").write_bytes(b"x")
    with pytest.raises(MissingCheckpointFileError,
                       match=r"File 'sub/opt\.bin' of .* does not exist"):
        verify_directory(location, manifest.files, retry=RETRY)
    assert issubclass(MissingCheckpointFileError, FileNotFoundError)


def test_every_damaged_file_is_named_and_damage_wins_over_order(
    checkpoint: tuple[StorageLocation, Manifest], tmp_path: Path, fifos: list[str]
) -> None:
    location, manifest = checkpoint
    make_fifo(tmp_path / "ckpt" / "sub" / "opt.bin", fifos)
    (tmp_path / "ckpt" / "model.bin").write_bytes(b"weights?")
    with pytest.raises(ChecksumMismatchError) as caught:
        bounded(lambda: verify_directory(location, manifest.files, retry=RETRY))
    text = str(caught.value)
    assert text.startswith("2 of 2 files under ")
    assert "File 'model.bin'" in text and "computed" in text
    assert "file 'sub/opt.bin' is a FIFO" in text


def test_the_bounded_copy_stops_at_its_limit() -> None:
    class Endless(io.RawIOBase):
        def readinto(self, buffer: Any) -> int:
            view = memoryview(buffer)
            view[:] = b"\0" * len(view)
            return len(view)

    buffer = memoryview(bytearray(4096))
    copied = stream_copy(Endless(), None, buffer, hasher=new_hasher(), progress=lambda _: None,
                         cancelled=lambda: False, limit=10_001)
    assert copied == 10_001


def test_the_manifest_itself_as_a_fifo_or_device_is_a_manifest_error(
    checkpoint: tuple[StorageLocation, Manifest], tmp_path: Path, fifos: list[str]
) -> None:
    location, _ = checkpoint
    manifest_path = tmp_path / "ckpt" / MANIFEST_NAME
    make_fifo(manifest_path, fifos)
    with pytest.raises(ManifestError, match=r"_cairn_manifest\.json is a FIFO, not a regular "
                                            r"file; Cairn reads regular files only"):
        bounded(lambda: read_manifest(location, RETRY))
    manifest_path.unlink()
    manifest_path.symlink_to("/dev/zero")
    with pytest.raises(ManifestError, match=r"is a device, not a regular file"):
        bounded(lambda: read_manifest(location, RETRY))
    manifest_path.unlink()
    manifest_path.write_bytes(b"{}" + b" " * 100)
    with pytest.raises(ManifestError, match=r"holds more than 50 bytes, more than Cairn ever "
                                            r"writes there"):
        read_bytes(location.join(MANIFEST_NAME), RETRY, limit=50)


def test_a_log_segment_that_is_a_fifo_is_skipped(tmp_path: Path, fifos: list[str],
                                                 caplog: pytest.LogCaptureFixture) -> None:
    events = tmp_path / "run" / "events"
    events.mkdir(parents=True)
    (events / "segment_000000.jsonl").write_text('{"type": "session_start", "t": 1.0}\n')
    make_fifo(events / "segment_000001.jsonl", fifos)
    records = bounded(lambda: read_log(resolve(str(events)), RETRY))
    assert records == [{"type": "session_start", "t": 1.0}]
    assert "Skipped 1 unreadable or invalid records" in caplog.text


@pytest.mark.parametrize("backend", ["memory", "dictstore"])
def test_other_backends_check_the_type_and_size_before_reading(
    backend: str, new_dict_store: Callable[[], Any], tmp_path: Path
) -> None:
    if backend == "memory":
        location = resolve(f"memory://reads-{uuid.uuid4().hex}/ckpt")
    else:
        location = resolve("bucket/ckpt", filesystem=new_dict_store())
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "a.bin").write_bytes(b"abc")
    (src / "d" / "x").write_bytes(b"x")
    entries = upload_directory(str(src), location)
    grown = {"a.bin": FileEntry(2, entries["a.bin"].checksum)}
    with pytest.raises(ChecksumMismatchError,
                       match=r"File 'a\.bin' of .* expected 2 bytes, storage holds 3"):
        verify_directory(location, grown, retry=RETRY)
    with pytest.raises(MissingCheckpointFileError, match=r"File 'b\.bin' of .* does not exist"):
        verify_directory(location, {"b.bin": entries["a.bin"]}, retry=RETRY)
    if backend == "memory":  # An object store has no directories to stand in for a file.
        with pytest.raises(NotARegularFileError, match=r"file 'd' is a directory"):
            verify_directory(location, {"d": entries["a.bin"]}, retry=RETRY)


# --- references (NO_UPLOAD) follow no link out (item 9) ------------------------------------

def test_a_reference_with_a_link_to_a_file_outside_is_refused_at_commit(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"root:x:0:0")
    reference = tmp_path / "reference"
    reference.mkdir()
    (reference / "state").write_bytes(b"{}")
    (reference / "passwd").symlink_to(secret)
    with pytest.raises(UnsafePathError,
                       match=r"The checkpoint at .*reference cannot be committed: In "
                             r".*reference, file 'passwd' is a symbolic link; .* Copy the data "
                             r"into the directory instead of linking to it: a checkpoint "
                             r"registered by reference is read in place"):
        compute_entries(resolve(str(reference)), ["state", "passwd"], retry=RETRY)
    # A local directory about to be uploaded follows its (already checked) links.
    (reference / "inner").symlink_to(reference / "state")
    entries = compute_entries(resolve(str(reference)), ["inner"], retry=RETRY,
                              follow_links=True)
    assert entries["inner"].size == 2


def test_a_reference_with_a_linked_directory_is_refused_at_commit(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "key").write_bytes(b"k")
    reference = tmp_path / "reference"
    reference.mkdir()
    (reference / "data").symlink_to(outside)
    with pytest.raises(UnsafePathError, match=r"the directory 'data' on the way to file "
                                              r"'data/key' is a symbolic link"):
        compute_entries(resolve(str(reference)), ["data/key"], retry=RETRY)


def test_a_reference_holding_a_fifo_is_refused_when_listed(tmp_path: Path,
                                                          fifos: list[str]) -> None:
    reference = tmp_path / "reference"
    reference.mkdir()
    (reference / "state").write_bytes(b"{}")
    make_fifo(reference / "pipe", fifos)
    with pytest.raises(StorageError, match=r"'.*/reference/pipe' in .*reference is not a regular "
                                           r"file \(a FIFO, socket or device, or a link to one\); "
                                           r"checkpoints may contain regular files and "
                                           r"directories only\."):
        bounded(lambda: list_files(resolve(str(reference)), RETRY))


# --- long names (item 10) --------------------------------------------------------------------

@pytest.mark.parametrize("length", [240, 255])
def test_a_legal_long_file_name_restores(tmp_path: Path, length: int) -> None:
    name = "n" * length
    location, _ = committed(tmp_path, {name: b"long", f"dir/{name}": b"longer"})
    out = tmp_path / "out"
    Checkpoint(location.path).to_directory(str(out))
    assert (out / name).read_bytes() == b"long"
    assert (out / "dir" / name).read_bytes() == b"longer"
    assert sorted(os.listdir(out)) == ["dir", name]  # No temporary file left behind.


def test_damage_classes_share_one_root() -> None:
    for cls in (ChecksumMismatchError, NotARegularFileError, MissingCheckpointFileError,
                ManifestError):
        assert issubclass(cls, CheckpointDamagedError)


def test_an_uncommitted_local_directory_copies_as_an_upload_would(tmp_path: Path) -> None:
    # Links inside are followed (as SYNC uploads follow them); a link out is refused.
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "real").write_bytes(b"real")
    (plain / "inner").symlink_to(plain / "real")
    out = Checkpoint.from_directory(plain).to_directory(str(tmp_path / "out"))
    assert Path(out, "inner").read_bytes() == b"real" and not Path(out, "inner").is_symlink()
    (tmp_path / "secret").write_bytes(b"s")
    (plain / "out_link").symlink_to(tmp_path / "secret")
    with pytest.raises(UnsafePathError, match=r"is a symbolic link to .*secret', outside the "
                                              r"checkpoint directory"):
        Checkpoint.from_directory(plain).to_directory(str(tmp_path / "out2"))
