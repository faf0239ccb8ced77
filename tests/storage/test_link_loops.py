"""A symbolic link loop (``x -> x``) planted where Cairn reads its own small files or lists
its own directories is damage, as a FIFO there is: :class:`ManifestError` naming the
file, or an empty listing, never an outage (``StorageError`` from ``ELOOP``) that callers
retry or give up on."""

from __future__ import annotations

from pathlib import Path

import pytest

from cairn import ManifestError
from cairn._src.storage.fileio import list_dir_names, list_files, read_bytes
from cairn._src.storage.location import resolve
from cairn._src.storage.retry import RetryPolicy

RETRY = RetryPolicy()


def test_a_file_that_is_a_link_loop_is_damage_naming_it(tmp_path: Path) -> None:
    (tmp_path / "lease.json").symlink_to("lease.json")
    with pytest.raises(ManifestError, match=r"lease\.json is a symbolic link loop \(a link "
                                            r"that leads back to itself\), not a regular file"):
        read_bytes(resolve(str(tmp_path / "lease.json")), RETRY)
    assert (tmp_path / "lease.json").is_symlink()  # read only, nothing changed


def test_a_file_behind_a_directory_that_is_a_link_loop_names_that_directory(
        tmp_path: Path) -> None:
    (tmp_path / "checkpoint_000001").symlink_to("checkpoint_000001")
    manifest = resolve(str(tmp_path / "checkpoint_000001" / "_cairn_manifest.json"))
    with pytest.raises(ManifestError) as caught:
        read_bytes(manifest, RETRY)
    assert (f"_cairn_manifest.json cannot be reached: {tmp_path / 'checkpoint_000001'} is a "
            "symbolic link loop") in str(caught.value)


def test_a_directory_that_is_a_link_loop_lists_as_empty(tmp_path: Path) -> None:
    # As a FIFO or a file in a directory's place does: it holds no entries.
    (tmp_path / "events").symlink_to("events")
    assert list_dir_names(resolve(str(tmp_path / "events")), RETRY) == []
    assert list_files(resolve(str(tmp_path / "events")), RETRY) == {}
    assert list_dir_names(resolve(str(tmp_path / "events" / "below")), RETRY) == []
    # The directory that holds the loop still lists (a loop points nowhere: left out).
    (tmp_path / "cairn_run.json").write_text("{}")
    assert list_dir_names(resolve(str(tmp_path)), RETRY) == ["cairn_run.json"]
    assert list_files(resolve(str(tmp_path)), RETRY) == {"cairn_run.json": 2}
