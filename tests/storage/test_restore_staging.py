"""A download is staged inside its target directory and moved into place once complete:
a failed one adds nothing, a finished one merges into what the target already holds."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from cairn._src.errors import ChecksumMismatchError
from cairn._src.storage import transfer
from cairn._src.storage.checksum import FileEntry
from cairn._src.storage.fileio import TEMPORARY_MARK
from cairn._src.storage.location import resolve
from cairn._src.storage.transfer import download_directory, upload_directory

BIG = 300 << 10  # above the small-file path's limit: the per-file path copies it


def write_tree(root: Path, contents: dict[str, bytes]) -> None:
    for rel, data in contents.items():
        path = root.joinpath(*rel.split("/"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def read_tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def stored(tmp_path: Path) -> tuple[str, dict[str, bytes], dict[str, FileEntry]]:
    contents = {f"d{i % 3}/f{i:03d}": os.urandom(64 + i) for i in range(60)}
    contents.update({"top": b"top", "d1/deep/x": b"x", "d2/big": os.urandom(BIG)})
    write_tree(tmp_path / "src", contents)
    location = str(tmp_path / "stored")
    entries = upload_directory(str(tmp_path / "src"), resolve(location))
    return location, contents, entries


def test_a_download_into_a_new_directory_leaves_nothing_but_the_files(
        stored: tuple[str, dict[str, bytes], dict[str, FileEntry]], tmp_path: Path) -> None:
    location, contents, entries = stored
    out = tmp_path / "out"
    download_directory(resolve(location), str(out), files=entries)
    assert read_tree(out) == contents
    assert sorted(os.listdir(out)) == ["d0", "d1", "d2", "top"]  # no staging directory


def test_a_failed_download_adds_nothing_to_the_target(
        stored: tuple[str, dict[str, bytes], dict[str, FileEntry]], tmp_path: Path) -> None:
    location, _, entries = stored
    # One small file damaged in storage: every other file was already copied when the
    # per-file path judges it.
    damaged = Path(location, "d1", "f031")
    damaged.write_bytes(b"\0" * damaged.stat().st_size)
    out = tmp_path / "out"
    write_tree(out, {"mine": b"the user's", "d0/mine": b"also the user's"})
    with pytest.raises(ChecksumMismatchError, match="d1/f031"):
        download_directory(resolve(location), str(out), files=entries)
    assert read_tree(out) == {"mine": b"the user's", "d0/mine": b"also the user's"}
    assert sorted(os.listdir(out)) == ["d0", "mine"]


def test_a_download_merges_into_what_the_target_holds(
        stored: tuple[str, dict[str, bytes], dict[str, FileEntry]], tmp_path: Path) -> None:
    location, contents, entries = stored
    out = tmp_path / "out"
    theirs = {"mine": b"kept", "d0/mine": b"kept too", "d1/deep/other": b"kept as well"}
    write_tree(out, {**theirs, "top": b"an older top", "d2/f002": b"an older f002"})
    download_directory(resolve(location), str(out), files=entries)
    assert read_tree(out) == {**contents, **theirs}


def test_a_directory_made_in_the_target_meanwhile_is_merged_into(
        stored: tuple[str, dict[str, bytes], dict[str, FileEntry]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Another download into the same directory (two ranks on one node) moves its d0 in
    # between this one's look at the target and its rename.
    location, contents, entries = stored
    out = tmp_path / "out"
    real = transfer._move_into

    def racing(staging: str, target: str) -> None:
        if target == str(out):
            write_tree(out, {"d0/f000": b"the other download's", "d0/theirs": b"theirs"})
        real(staging, target)

    monkeypatch.setattr(transfer, "_move_into", racing)
    real_isdir = os.path.isdir
    looked: list[str] = []

    def not_yet(path: str) -> bool:
        # The look happened before the other download's d0 arrived.
        if path == str(out / "d0") and not looked:
            looked.append(path)
            return False
        return real_isdir(path)

    monkeypatch.setattr(transfer.os.path, "isdir", not_yet)
    download_directory(resolve(location), str(out), files=entries)
    assert looked
    assert read_tree(out) == {**contents, "d0/theirs": b"theirs"}


def test_a_linked_directory_of_the_target_is_written_into(
        stored: tuple[str, dict[str, bytes], dict[str, FileEntry]], tmp_path: Path) -> None:
    # A user's target whose d0 is a link to a directory elsewhere, as before staging.
    location, contents, entries = stored
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (out / "d0").symlink_to(elsewhere, target_is_directory=True)
    download_directory(resolve(location), str(out), files=entries)
    assert (out / "d0").is_symlink()
    assert read_tree(elsewhere) == {rel.split("/", 1)[1]: data for rel, data in
                                    contents.items() if rel.startswith("d0/")}


def test_a_linked_directory_on_another_file_system_is_filled_by_copies(
        stored: tuple[str, dict[str, bytes], dict[str, FileEntry]], tmp_path: Path) -> None:
    # The target's d1 links to a directory on tmpfs: renames from the staging directory
    # into it fail with EXDEV, so its files (and d1/deep) are copied there instead.
    location, contents, entries = stored
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("needs /dev/shm on a file system of its own")
    elsewhere = Path(tempfile.mkdtemp(dir=shm))
    try:
        out = tmp_path / "out"
        out.mkdir()
        (out / "d1").symlink_to(elsewhere, target_is_directory=True)
        download_directory(resolve(location), str(out), files=entries)
        assert read_tree(out) == {rel: data for rel, data in contents.items()
                                  if not rel.startswith("d1/")}
        assert read_tree(elsewhere) == {rel.split("/", 1)[1]: data for rel, data in
                                        contents.items() if rel.startswith("d1/")}
        assert not [p for p in elsewhere.rglob("*") if TEMPORARY_MARK in p.name]
    finally:
        shutil.rmtree(elsewhere)


def test_a_file_in_the_way_of_a_directory_fails_before_any_copy(
        stored: tuple[str, dict[str, bytes], dict[str, FileEntry]], tmp_path: Path) -> None:
    location, _, entries = stored
    out = tmp_path / "out"
    write_tree(out, {"d1": b"a file where the checkpoint has a directory"})
    with pytest.raises(FileExistsError, match=r"'d1' is a directory of the checkpoint"):
        download_directory(resolve(location), str(out), files=entries)
    assert sorted(os.listdir(out)) == ["d1"]
    # A link to a file in the way of a deeper directory, the same.
    write_tree(tmp_path / "other", {"d1/deep": b"a file"})
    with pytest.raises(FileExistsError, match=r"'d1/deep' is a directory of the checkpoint"):
        download_directory(resolve(location), str(tmp_path / "other"), files=entries)


def test_a_directory_in_the_way_of_a_file_fails_before_any_file_moves(
        stored: tuple[str, dict[str, bytes], dict[str, FileEntry]], tmp_path: Path) -> None:
    location, contents, entries = stored
    out = tmp_path / "out"
    # The user's files with the checkpoint's names, and a directory where it has a file.
    mine = {rel: b"the user's" for rel in contents if rel.startswith("d0/")}
    write_tree(out, {**mine, "d2/big/inside": b"the user's directory"})
    with pytest.raises(FileExistsError, match=r"'d2/big' is a file of the checkpoint, and a "
                                              r"directory has its name there"):
        download_directory(resolve(location), str(out), files=entries)
    assert read_tree(out) == {**mine, "d2/big/inside": b"the user's directory"}


def test_a_download_killed_midway_leaves_no_file_under_its_name(tmp_path: Path) -> None:
    # kill -9 while the files are copied: what it wrote is inside the staging directory
    # only (which carries the temporary mark), nothing under a name of the checkpoint.
    contents = {f"d{i // 500}/f{i:05d}": b"x" * 512 for i in range(5000)}
    write_tree(tmp_path / "src", contents)
    location = str(tmp_path / "stored")
    entries = upload_directory(str(tmp_path / "src"), resolve(location))
    out = tmp_path / "out"
    out.mkdir()
    script = (
        "import sys\n"
        "from cairn._src.storage import transfer\n"
        "from cairn._src.storage.location import resolve\n"
        "from cairn._src.checkpoint.manifest import read_manifest\n"
        "real = transfer._move_into\n"
        "def hold(staging, target):\n"
        "    print('copied', flush=True)\n"
        "    sys.stdin.read()\n"
        "transfer._move_into = hold\n"
        f"files = read_manifest(resolve({location!r})).files\n"
        f"transfer.download_directory(resolve({location!r}), {str(out)!r}, files=files)\n")
    from cairn._src.checkpoint.manifest import Manifest, write_manifest
    write_manifest(resolve(location), Manifest(files=entries))
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
    assert child.stdout is not None
    assert child.stdout.readline() == b"copied\n"  # every file written, none moved yet
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    left = os.listdir(out)
    assert len(left) == 1 and left[0].startswith(f"{TEMPORARY_MARK}restore-")
    assert (out / left[0]).stat().st_mode & 0o777 == 0o700  # no one else's to write in
    assert len(read_tree(out / left[0])) == len(contents)
    # A later download into the same directory is not confused by the leftover.
    download_directory(resolve(location), str(out), files=entries)
    assert read_tree(out) == {**contents, **{f"{left[0]}/{rel}": data
                                             for rel, data in contents.items()}}
