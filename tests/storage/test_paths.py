"""Relative-path checks and local directory listings: the bad input they refuse."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cairn._src.errors import (
    CheckpointNotFoundError,
    NotADirectoryCheckpointError,
    StorageError,
    UnsafePathError,
)
from cairn._src.storage.paths import check_relative_path, list_local_files


@pytest.mark.parametrize(
    ("given", "expected"),
    [("a", "a"), ("a/b/c.pt", "a/b/c.pt"), ("./a//b/", "a/b"), ("a/./b", "a/b"),
     ("name with spaces", "name with spaces"), ("..hidden", "..hidden")],
)
def test_check_relative_path_normalizes(given: str, expected: str) -> None:
    assert check_relative_path(given) == expected


@pytest.mark.parametrize(
    ("given", "match"),
    [
        ("../escape", r"'\.\.' component"),
        ("a/../../b", r"'\.\.' component"),
        ("/etc/passwd", "is an absolute path"),
        ("", "names no file"),
        ("./", "names no file"),
        ("a\\b", "backslash or NUL"),
        ("a\x00b", "backslash or NUL"),
    ],
)
def test_check_relative_path_refuses(given: str, match: str) -> None:
    with pytest.raises(UnsafePathError, match=match):
        check_relative_path(given, argument="checkpoint_dir_name")


def test_check_relative_path_names_the_argument() -> None:
    with pytest.raises(UnsafePathError, match=r"^checkpoint_dir_name='\.\./x'"):
        check_relative_path("../x", argument="checkpoint_dir_name")
    with pytest.raises(UnsafePathError, match="must be a str, got int"):
        check_relative_path(3)  # type: ignore[arg-type]


def test_list_local_files(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "x").write_bytes(b"123")
    (tmp_path / "empty").write_bytes(b"")
    (tmp_path / "emptydir").mkdir()
    assert list_local_files(str(tmp_path)) == {"a/b/x": 3, "empty": 0}


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(CheckpointNotFoundError, match=r"'.*/nope' does not exist"):
        list_local_files(str(tmp_path / "nope"))


def test_file_where_a_directory_is_expected(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(NotADirectoryCheckpointError, match="is a file, not a directory"):
        list_local_files(str(tmp_path / "f"))


def test_symlink_inside_is_followed(tmp_path: Path) -> None:
    (tmp_path / "real.bin").write_bytes(b"abcd")
    (tmp_path / "sub").mkdir()
    os.symlink(tmp_path / "real.bin", tmp_path / "link.bin")
    os.symlink(tmp_path / "sub", tmp_path / "sublink")
    (tmp_path / "sub" / "y").write_bytes(b"y")
    assert list_local_files(str(tmp_path)) == {
        "real.bin": 4, "link.bin": 4, "sub/y": 1, "sublink/y": 1,
    }


def test_symlink_escaping_the_directory(tmp_path: Path) -> None:
    (tmp_path / "secret").write_bytes(b"s")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    os.symlink(tmp_path / "secret", ckpt / "innocent")
    with pytest.raises(UnsafePathError, match=r"symbolic link to .*secret', outside"):
        list_local_files(str(ckpt))


def test_symlink_loop_is_refused(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    os.symlink(tmp_path, tmp_path / "d" / "up")
    with pytest.raises(UnsafePathError, match="loops back"):
        list_local_files(str(tmp_path))


def test_broken_symlink(tmp_path: Path) -> None:
    os.symlink(tmp_path / "gone", tmp_path / "dangling")
    with pytest.raises(StorageError, match="broken symbolic link"):
        list_local_files(str(tmp_path))


def test_unreadable_special_file_is_refused(tmp_path: Path) -> None:
    # Tests run as root, for whom chmod 000 changes nothing; a FIFO cannot be read either
    # (a read would block forever), so it stands in for an unreadable file.
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(StorageError, match=r"pipe' in the checkpoint is not a regular file"):
        list_local_files(str(tmp_path))


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "locked").write_bytes(b"x")
    os.chmod(tmp_path / "locked", 0)
    try:
        with pytest.raises(StorageError, match=r"locked' in the checkpoint cannot be read"):
            list_local_files(str(tmp_path))
    finally:
        os.chmod(tmp_path / "locked", 0o600)


def test_the_quick_accept_agrees_with_the_full_check(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every string of up to four characters from an alphabet of the separators, dots and
    # a letter: what the quick accept returns, the full check returns too.
    import itertools

    from cairn._src.storage import paths

    alphabet = ["a", "/", ".", "\\", "\x00", "b"]
    quick = {}
    for length in range(1, 5):
        for chars in itertools.product(alphabet, repeat=length):
            rel = "".join(chars)
            if paths._is_plain(rel):
                quick[rel] = paths.check_relative_path(rel)
    assert quick and all(rel == got for rel, got in quick.items())
    monkeypatch.setattr(paths, "_is_plain", lambda rel: False)
    assert {rel: paths.check_relative_path(rel) for rel in quick} == quick


def test_the_check_of_many_names_at_once_agrees_with_the_check_of_each() -> None:
    # Every name of up to five pieces from an alphabet of separators, dots, a newline (the
    # joiner) and letters, alone and in random groups: all of them accepted at once
    # exactly when each is accepted unchanged (a name with a newline goes name by name).
    import itertools
    import random

    from cairn._src.storage.paths import are_normal_relative_paths, is_normal_relative_path

    def each(names: list[str]) -> bool:
        return all(is_normal_relative_path(rel) and "\n" not in rel for rel in names)

    alphabet = ["a", "/", ".", "..", "\\", "\x00", "\n", "é"]
    for length in range(6):
        for pieces in itertools.product(alphabet, repeat=length):
            rel = "".join(pieces)
            assert are_normal_relative_paths([rel]) == each([rel]), rel
    chooser = random.Random(7)
    for _ in range(5000):
        names = ["".join(chooser.choices(alphabet, k=chooser.randint(0, 4)))
                 for _ in range(chooser.randint(1, 4))]
        assert are_normal_relative_paths(names) == each(names), names
    assert are_normal_relative_paths([]) and are_normal_relative_paths({"a/b": 1, ".x/y": 2})
    assert not are_normal_relative_paths(["a", 1])  # type: ignore[list-item]
    assert not are_normal_relative_paths(["a/b", "a/./b"])


def test_listing_asks_the_system_only_when_the_owner_bits_do_not_say_readable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The owner's read permission is its mode bits; anything else (another owner, no
    # owner read bit) is left to os.access, which knows about groups and access lists.
    (tmp_path / "mine.bin").write_bytes(b"1")
    (tmp_path / "no-owner-read.bin").write_bytes(b"2")
    os.chmod(tmp_path / "no-owner-read.bin", 0o044)
    asked: list[str] = []
    real_access = os.access

    def access(path: str, mode: int) -> bool:
        asked.append(os.path.basename(path))
        return real_access(path, mode)

    monkeypatch.setattr(os, "access", access)
    try:
        listing = list_local_files(str(tmp_path))
    except StorageError as exc:  # not root: the system says it cannot be read
        assert "no-owner-read.bin" in str(exc) and "permission denied" in str(exc)
    else:  # root reads it anyway, as os.access says
        assert listing == {"mine.bin": 1, "no-owner-read.bin": 1}
    assert asked == ["no-owner-read.bin"]
