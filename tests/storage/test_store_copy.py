"""copy_directory: a directory copied from one store to another, checksummed as it
streams, on the stores every backend test uses."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from cairn._src.errors import StorageError, UnsafePathError
from cairn._src.storage.fileio import needs_directories
from cairn._src.storage.location import StorageLocation, resolve
from cairn._src.storage.store_copy import copy_directory
from cairn._src.storage.transfer import compute_entries

FILES = {"model.bin": b"w" * 300_000, "nested/deeper/opt.bin": b"o" * 1000, "empty": b""}


def put(location: StorageLocation, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        target = location.join(rel)
        if needs_directories(location.filesystem):
            location.filesystem.create_dir(target.path.rpartition("/")[0], recursive=True)
        with location.filesystem.open_output_stream(target.path) as f:
            f.write(data)


@pytest.mark.parametrize("destination_kind", ["local", "memory"])
def test_a_directory_on_a_store_is_copied_with_the_checksums_of_its_bytes(
    storage_uri: str, destination_kind: str, tmp_path: Path
) -> None:
    source = resolve(storage_uri).join("source")
    put(source, FILES)
    destination = resolve(str(tmp_path / "copy") if destination_kind == "local"
                          else f"memory://copies/{uuid.uuid4().hex}")
    entries = copy_directory(source, destination,
                             files={rel: len(data) for rel, data in FILES.items()})
    assert set(entries) == set(FILES)
    assert {rel: entry.size for rel, entry in entries.items()} == {
        rel: len(data) for rel, data in FILES.items()}
    # What was written hashes to what the copy reported, read back from the destination.
    assert compute_entries(destination, list(FILES)) == entries
    assert compute_entries(source, list(FILES)) == entries


def test_a_file_that_changed_since_it_was_listed_is_copied_as_it_is_now(
    tmp_path: Path
) -> None:
    uri = f"memory://changing/{uuid.uuid4().hex}"
    put(resolve(uri), {"a.bin": b"longer than listed"})
    entries = copy_directory(resolve(uri), resolve(str(tmp_path / "copy")), files={"a.bin": 3})
    assert entries["a.bin"].size == len(b"longer than listed")
    assert (tmp_path / "copy" / "a.bin").read_bytes() == b"longer than listed"


def test_a_missing_file_and_an_unsafe_name_are_refused(tmp_path: Path) -> None:
    uri = f"memory://missing/{uuid.uuid4().hex}"
    put(resolve(uri), {"a.bin": b"a"})
    with pytest.raises(StorageError, match=r"gone\.bin"):
        copy_directory(resolve(uri), resolve(str(tmp_path / "copy")), files={"gone.bin": 1})
    with pytest.raises(UnsafePathError):
        copy_directory(resolve(uri), resolve(str(tmp_path / "copy")), files={"../a.bin": 1})
