"""The cheap resume check (``check_directory_sizes``): every file a regular file of the
recorded size, no data read; each kind of damage it can see without reading is refused."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cairn._src.errors import (
    ChecksumMismatchError,
    MissingCheckpointFileError,
    NotARegularFileError,
)
from cairn._src.storage.checksum import FileEntry
from cairn._src.storage.location import resolve
from cairn._src.storage.retry import RetryPolicy
from cairn._src.storage.transfer import check_directory_sizes, upload_directory

RETRY = RetryPolicy(max_attempts=1)


def committed(tmp_path: Path) -> tuple[Path, dict[str, FileEntry]]:
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "a.bin").write_bytes(b"abc")
    (src / "d" / "x").write_bytes(b"x")
    dest = tmp_path / "ckpt"
    entries = upload_directory(str(src), resolve(str(dest)))
    return dest, entries


def test_an_intact_checkpoint_passes_and_a_same_size_flip_is_left_to_checksums(
    tmp_path: Path,
) -> None:
    dest, entries = committed(tmp_path)
    check_directory_sizes(resolve(str(dest)), entries, retry=RETRY)
    (dest / "a.bin").write_bytes(b"abX")  # same size: the workers' checksums catch it
    check_directory_sizes(resolve(str(dest)), entries, retry=RETRY)


@pytest.mark.parametrize("damage, error, message", [
    ("grow", ChecksumMismatchError, r"File 'a\.bin' of .* expected 3 bytes, storage holds 4"),
    ("delete", MissingCheckpointFileError, r"File 'a\.bin' of .* does not exist"),
    ("dev_zero", NotARegularFileError, r"file 'a\.bin' is a symbolic link"),
    ("fifo", NotARegularFileError, r"file 'a\.bin' is a FIFO"),
    ("directory", NotARegularFileError, r"file 'a\.bin' is a directory"),
    ("parent_link", NotARegularFileError, r"the directory 'd' on the way to file 'd/x' is a "
                                          r"symbolic link"),
])
def test_local_damage_is_refused_without_reading(
    tmp_path: Path, damage: str, error: type[Exception], message: str
) -> None:
    dest, entries = committed(tmp_path)
    target = dest / "a.bin"
    if damage == "grow":
        target.write_bytes(b"abcd")
    elif damage == "delete":
        target.unlink()
    elif damage == "dev_zero":
        target.unlink()
        target.symlink_to("/dev/zero")
    elif damage == "fifo":
        target.unlink()
        os.mkfifo(target)
    elif damage == "directory":
        target.unlink()
        target.mkdir()
    else:
        elsewhere = tmp_path / "elsewhere"
        (dest / "d").rename(elsewhere)
        (dest / "d").symlink_to(elsewhere)
    with pytest.raises(error, match=message):
        check_directory_sizes(resolve(str(dest)), entries, retry=RETRY)


@pytest.mark.parametrize("backend", ["memory", "dictstore"])
def test_object_stores_compare_one_listing(
    backend: str, new_dict_store: Callable[[], Any], tmp_path: Path
) -> None:
    if backend == "memory":
        location = resolve(f"memory://sizes-{uuid.uuid4().hex}/ckpt")
    else:
        location = resolve("bucket/ckpt", filesystem=new_dict_store())
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(b"abc")
    entries = upload_directory(str(src), location)
    check_directory_sizes(location, entries, retry=RETRY)
    with pytest.raises(ChecksumMismatchError,
                       match=r"File 'a\.bin' of .* expected 2 bytes, storage holds 3"):
        check_directory_sizes(location, {"a.bin": FileEntry(2, entries["a.bin"].checksum)},
                              retry=RETRY)
    with pytest.raises(MissingCheckpointFileError, match=r"File 'b\.bin' of .* does not exist"):
        check_directory_sizes(location, {"b.bin": entries["a.bin"]}, retry=RETRY)
