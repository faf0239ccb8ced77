"""The storage conformance suite: what every backend must do, at the StorageLocation level.

Subclass :class:`StorageConformance` and provide a ``base_uri`` fixture returning a fresh,
empty base URI on the backend (see ``test_conformance.py``).
"""

from __future__ import annotations

import os
import pickle
import random
from pathlib import Path

import pytest
import xxhash
from stores import FailureSchedule, flaky_location

from cairn._src.checkpoint.checkpoint import Checkpoint
from cairn._src.checkpoint.manifest import MANIFEST_NAME, Manifest, write_manifest
from cairn._src.errors import CheckpointNotFoundError, ChecksumMismatchError, ManifestError
from cairn._src.storage import fileio
from cairn._src.storage.location import StorageLocation, resolve
from cairn._src.storage.retry import RetryPolicy
from cairn._src.storage.transfer import (
    compute_entries,
    download_directory,
    upload_directory,
    verify_directory,
)

FAST_RETRY = RetryPolicy(max_attempts=20, initial_backoff_s=0.0, max_backoff_s=0.0)


def make_tree(root: Path) -> dict[str, bytes]:
    """A directory with nested, empty, multi-chunk and oddly named files."""
    rng = random.Random(7)
    files = {
        "a.bin": rng.randbytes(300 * 1024),
        "empty": b"",
        "nested/deeper/c.txt": b"hello",
        "nested/big.bin": rng.randbytes(5 * 1024 * 1024 + 123),
        "with space.txt": b"spaces are fine",
    }
    for rel, data in files.items():
        path = root.joinpath(*rel.split("/"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


def read_tree(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()
    }


class StorageConformance:
    @pytest.fixture
    def base(self, base_uri: str) -> StorageLocation:
        return resolve(base_uri)

    # --- small files ------------------------------------------------------------------

    def test_write_read_overwrite(self, base: StorageLocation) -> None:
        loc = base.join("dir", "index.json")
        fileio.write_bytes_atomic(loc, b"first")
        assert fileio.read_bytes(loc) == b"first"
        fileio.write_bytes_atomic(loc, b"second, longer")
        assert fileio.read_bytes(loc) == b"second, longer"
        # No temporary file is left next to it.
        assert fileio.list_files(base) == {"dir/index.json": 14}

    def test_read_missing_raises_not_found(self, base: StorageLocation) -> None:
        with pytest.raises(CheckpointNotFoundError, match="does not exist"):
            fileio.read_bytes(base.join("nope.json"))

    def test_exists_is_dir_is_file(self, base: StorageLocation) -> None:
        fileio.write_bytes_atomic(base.join("d", "f"), b"x")
        assert fileio.exists(base.join("d")) and fileio.is_dir(base.join("d"))
        assert fileio.is_file(base.join("d", "f")) and not fileio.is_dir(base.join("d", "f"))
        assert not fileio.exists(base.join("missing"))
        assert not fileio.is_dir(base.join("missing"))

    def test_list_files_and_names(self, base: StorageLocation) -> None:
        fileio.write_bytes_atomic(base.join("top.txt"), b"12")
        fileio.write_bytes_atomic(base.join("sub", "x"), b"")
        fileio.write_bytes_atomic(base.join("sub", "deep", "y"), b"abc")
        assert fileio.list_files(base) == {"top.txt": 2, "sub/x": 0, "sub/deep/y": 3}
        assert fileio.list_files(base.join("sub")) == {"x": 0, "deep/y": 3}
        assert fileio.list_dir_names(base) == ["sub", "top.txt"]
        assert fileio.list_files(base.join("missing")) == {}
        assert fileio.list_dir_names(base.join("missing")) == []

    def test_delete(self, base: StorageLocation) -> None:
        fileio.write_bytes_atomic(base.join("keep"), b"k")
        fileio.write_bytes_atomic(base.join("gone", "a"), b"a")
        fileio.write_bytes_atomic(base.join("gone", "b", "c"), b"c")
        fileio.delete_file(base.join("gone", "a"))
        fileio.delete_file(base.join("gone", "a"))  # Missing is fine.
        fileio.delete_dir(base.join("gone"))
        fileio.delete_dir(base.join("gone"))
        assert fileio.list_files(base) == {"keep": 1}

    # --- locations ---------------------------------------------------------------------

    def test_location_pickles_and_uri_resolves_back(self, base: StorageLocation) -> None:
        loc = base.join("ckpt 1", "file.txt")
        fileio.write_bytes_atomic(loc, b"payload")
        again = pickle.loads(pickle.dumps(loc))
        assert again.path == loc.path and again.uri == loc.uri
        assert fileio.read_bytes(again) == b"payload"
        assert loc.uri is not None
        assert fileio.read_bytes(resolve(loc.uri)) == b"payload"

    # --- directory transfers ------------------------------------------------------------

    def test_upload_download_round_trip(self, base: StorageLocation, tmp_path: Path) -> None:
        files = make_tree(tmp_path / "src")
        progress: list[int] = []
        entries = upload_directory(str(tmp_path / "src"), base.join("ck"), progress=progress.append)
        assert set(entries) == set(files)
        for rel, data in files.items():
            assert entries[rel].size == len(data)
            assert entries[rel].checksum == xxhash.xxh3_128(data).hexdigest()
        assert sum(progress) == sum(len(d) for d in files.values())
        assert fileio.list_files(base.join("ck")) == {r: len(d) for r, d in files.items()}

        download_directory(base.join("ck"), str(tmp_path / "dst"), files=entries)
        assert read_tree(tmp_path / "dst") == files
        # Without a file list, everything under the location comes down.
        download_directory(base.join("ck"), str(tmp_path / "dst2"))
        assert read_tree(tmp_path / "dst2") == files
        assert compute_entries(base.join("ck"), list(files)) == entries
        verify_directory(base.join("ck"), entries)

    def test_upload_selected_files(self, base: StorageLocation, tmp_path: Path) -> None:
        make_tree(tmp_path / "src")
        entries = upload_directory(
            str(tmp_path / "src"), base.join("ck"),
            files=["a.bin", "nested/deeper/c.txt", "empty"], exclude={"empty"},
        )
        assert sorted(entries) == ["a.bin", "nested/deeper/c.txt"]
        assert sorted(fileio.list_files(base.join("ck"))) == ["a.bin", "nested/deeper/c.txt"]

    def test_parallel_transfer_of_many_files(self, base: StorageLocation, tmp_path: Path) -> None:
        src = tmp_path / "many"
        expected = {}
        for i in range(40):
            data = os.urandom(i * 997)
            (src / f"d{i % 4}").mkdir(parents=True, exist_ok=True)
            (src / f"d{i % 4}" / f"f{i}").write_bytes(data)
            expected[f"d{i % 4}/f{i}"] = data
        entries = upload_directory(str(src), base.join("many"), max_workers=8)
        download_directory(base.join("many"), str(tmp_path / "out"), files=entries, max_workers=8)
        assert read_tree(tmp_path / "out") == expected

    def test_corrupted_file_is_detected(self, base: StorageLocation, tmp_path: Path) -> None:
        files = make_tree(tmp_path / "src")
        entries = upload_directory(str(tmp_path / "src"), base.join("ck"))
        bad = bytearray(files["a.bin"])
        bad[1000] ^= 0xFF
        fileio.write_bytes_atomic(base.join("ck", "a.bin"), bytes(bad))
        with pytest.raises(ChecksumMismatchError, match=r"a\.bin.*expected xxh3_128 checksum"):
            verify_directory(base.join("ck"), entries)
        out = tmp_path / "dst"
        with pytest.raises(ChecksumMismatchError, match=r"File 'a\.bin' of .* is corrupt"):
            download_directory(base.join("ck"), str(out), files=entries, max_workers=1)
        # Neither the final name nor a temporary file of the bad file remains.
        assert not any(name.startswith("a.bin") for name in os.listdir(out))

    def test_missing_file_is_detected(self, base: StorageLocation, tmp_path: Path) -> None:
        make_tree(tmp_path / "src")
        entries = upload_directory(str(tmp_path / "src"), base.join("ck"))
        fileio.delete_file(base.join("ck", "nested", "deeper", "c.txt"))
        with pytest.raises(CheckpointNotFoundError, match=r"nested/deeper/c\.txt"):
            verify_directory(base.join("ck"), entries)

    def test_transfers_survive_transient_failures(
        self, base: StorageLocation, tmp_path: Path
    ) -> None:
        files = make_tree(tmp_path / "src")
        schedule = FailureSchedule(every=3)
        flaky = flaky_location(base.join("ck"), schedule)
        entries = upload_directory(str(tmp_path / "src"), flaky, retry=FAST_RETRY)
        download_directory(flaky, str(tmp_path / "dst"), files=entries, retry=FAST_RETRY)
        verify_directory(flaky, entries, retry=FAST_RETRY)
        fileio.write_bytes_atomic(flaky.join("small"), b"s", retry=FAST_RETRY)
        assert fileio.read_bytes(flaky.join("small"), retry=FAST_RETRY) == b"s"
        assert read_tree(tmp_path / "dst") == files
        assert schedule.failures > 0

    # --- checkpoints ------------------------------------------------------------------

    def test_checkpoint_round_trip(self, base: StorageLocation, tmp_path: Path) -> None:
        files = make_tree(tmp_path / "src")
        loc = base.join("checkpoint_000001")
        entries = upload_directory(str(tmp_path / "src"), loc)
        assert loc.uri is not None
        checkpoint = Checkpoint(loc.uri)
        assert checkpoint.get_manifest() is None
        with pytest.raises(ManifestError, match="no manifest"):
            checkpoint.verify()
        # Before commit, metadata lives in .metadata.json.
        checkpoint.set_metadata({"epoch": 1})
        assert checkpoint.get_metadata() == {"epoch": 1}

        write_manifest(loc, Manifest(files=entries, report_index=1, metrics={"loss": 0.5}))
        assert checkpoint.get_manifest() is not None
        checkpoint.verify()
        assert checkpoint.get_metadata() == {}
        checkpoint.set_metadata({"epoch": 2, "note": "x"})
        checkpoint.update_metadata({"note": "y"})
        assert checkpoint.get_metadata() == {"epoch": 2, "note": "y"}
        manifest = checkpoint.get_manifest()
        assert manifest is not None and manifest.metrics == {"loss": 0.5}

        target = checkpoint.to_directory(str(tmp_path / "restored"))
        # The manifest is not copied; its metadata comes as .metadata.json, as Ray's copy has it.
        assert read_tree(Path(target)) == {**files, ".metadata.json": b'{"epoch": 2, "note": "y"}'}
        assert Checkpoint.from_directory(target).get_metadata() == {"epoch": 2, "note": "y"}
        with checkpoint.as_directory() as directory:
            assert read_tree(Path(directory))["nested/deeper/c.txt"] == b"hello"
            assert os.path.exists(os.path.join(directory, "a.bin"))

        again = pickle.loads(pickle.dumps(checkpoint))
        assert again == checkpoint and hash(again) == hash(checkpoint)
        assert again.get_metadata() == {"epoch": 2, "note": "y"}
        assert MANIFEST_NAME in fileio.list_files(loc)
