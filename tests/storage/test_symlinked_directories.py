"""Storage reached through a symbolic link to a directory: a ``storage_path`` such as
``~/ray_results -> /mnt/nvme/ray_results`` is fsynced through the link (files never are),
and a listing never follows a link to a directory (a loop, or a way out)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

import cairn
from cairn._src.errors import NotARegularFileError, StorageError
from cairn._src.storage.durability import fsync_path
from cairn._src.storage.fileio import list_files, write_bytes_atomic
from cairn._src.storage.location import resolve
from cairn._src.storage.reader import open_regular_file


def test_a_durable_write_under_a_link_to_a_directory_succeeds(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    write_bytes_atomic(resolve(str(link)).join("x"), b"", durable=True)
    assert (real / "x").read_bytes() == b""
    fsync_path(str(link))  # the directory itself, through its link


def test_a_link_to_a_file_is_never_fsynced_through(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "file")
    with pytest.raises(OSError):
        fsync_path(str(tmp_path / "link"))


def test_fit_with_a_storage_path_that_is_a_link_commits_a_checkpoint(tmp_path: Path) -> None:
    real = tmp_path / "nvme" / "ray_results"
    real.mkdir(parents=True)
    link = tmp_path / "ray_results"
    link.symlink_to(real, target_is_directory=True)
    scratch = tmp_path / "scratch"

    def train() -> None:
        directory = scratch / f"rank_{cairn.get_context().get_world_rank()}"
        directory.mkdir(parents=True)
        (directory / "weights.bin").write_bytes(b"w" * 10)
        cairn.report({"step": 1}, checkpoint=cairn.Checkpoint.from_directory(str(directory)))

    result = cairn.Trainer(train, run_config=cairn.RunConfig(
        storage_path=str(link), name="fresh_run", progress=0)).fit()
    assert result.error is None
    assert result.checkpoint is not None
    run = real / "fresh_run"
    checkpoints = [name for name in os.listdir(run) if name.startswith("checkpoint_")]
    assert len(checkpoints) == 1
    assert (run / checkpoints[0] / "weights.bin").read_bytes() == b"w" * 10


def _list_in_thread(directory: Path) -> dict[str, int]:
    """list_files(directory), run in a daemon thread: a walk that never ends fails the
    test instead of hanging it."""
    result: list[dict[str, int]] = []
    walker = threading.Thread(target=lambda: result.append(list_files(resolve(str(directory)))),
                              daemon=True)
    walker.start()
    walker.join(timeout=120)
    assert not walker.is_alive(), "list_files never finished"
    return result[0]


def test_links_that_loop_back_are_listed_as_entries_not_walked(tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint"
    (checkpoint / "sub").mkdir(parents=True)
    (checkpoint / "sub" / "weights.bin").write_bytes(b"w" * 7)
    (checkpoint / "a").symlink_to(".", target_is_directory=True)
    (checkpoint / "b").symlink_to(".", target_is_directory=True)
    listed = _list_in_thread(checkpoint)
    assert listed == {"sub/weights.bin": 7, "a": 0, "b": 0}
    with pytest.raises(NotARegularFileError, match="symbolic link"), open_regular_file(
            resolve(str(checkpoint)), "a", expected_size=listed["a"]):
        pass


def test_a_link_out_of_the_checkpoint_lists_nothing_from_outside(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_bytes(b"s" * 5)
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "evil").symlink_to(outside, target_is_directory=True)
    (checkpoint / "leak.txt").symlink_to(outside / "secret.txt")
    (checkpoint / "dangling").symlink_to(tmp_path / "nowhere")
    listed = _list_in_thread(checkpoint)
    assert not [name for name in listed if name.startswith("evil/")]
    # Links are entries of their own (a file's at its target's size, as before), which
    # the bounded reader refuses to read.
    assert listed == {"evil": 0, "leak.txt": 5}


def test_a_link_to_a_fifo_is_refused_as_a_fifo_is(tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    os.mkfifo(tmp_path / "fifo")
    (checkpoint / "pipe").symlink_to(tmp_path / "fifo")
    with pytest.raises(StorageError, match=r"/pipe' in .* is not a regular file \(a FIFO"):
        list_files(resolve(str(checkpoint)))


def test_a_missing_directory_or_a_file_lists_as_empty(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"x")
    assert list_files(resolve(str(tmp_path / "missing"))) == {}
    assert list_files(resolve(str(tmp_path / "file"))) == {}
