"""How many threads a directory transfer uses: one for small local files, up to the cores
for large local ones, every allowed one for remote storage."""

from __future__ import annotations

import os

import fsspec
import pyarrow.fs as pafs

from cairn._src.storage.transfer import _plan


def test_small_local_files_use_one_thread_and_large_ones_the_cores() -> None:
    local = pafs.LocalFileSystem()
    assert _plan(local, 8, [1024] * 10_000)[1] == 1
    assert _plan(local, 8, [8 << 20] * 4)[1] == min(8, max(2, os.cpu_count() or 1))
    assert _plan(local, 8)[1] == min(8, max(2, os.cpu_count() or 1))  # sizes unknown
    assert _plan(local, 1, [8 << 20] * 4)[1] == 1


def test_remote_storage_uses_every_allowed_thread_whatever_the_sizes() -> None:
    remote = pafs.PyFileSystem(pafs.FSSpecHandler(fsspec.filesystem("memory")))
    assert _plan(remote, 8, [1024] * 10_000)[1] == 8


def test_a_background_copy_to_local_storage_uses_one_thread_and_large_chunks() -> None:
    local = pafs.LocalFileSystem()
    assert _plan(local, None, [64 << 20] * 8, background=True) == (16 << 20, 1)
    assert _plan(local, None, background=True) == (16 << 20, 1)  # sizes unknown
    # A caller that asks for more threads gets them, up to the cores, as in the foreground.
    cores = max(2, os.cpu_count() or 1)
    assert _plan(local, 8, [64 << 20] * 8, background=True) == (16 << 20, min(8, cores))
    assert _plan(local, 8, [1024] * 100, background=True) == (16 << 20, 1)


def test_a_background_copy_to_remote_storage_keeps_its_concurrency() -> None:
    remote = pafs.PyFileSystem(pafs.FSSpecHandler(fsspec.filesystem("memory")))
    assert _plan(remote, None, [64 << 20] * 8, background=True) == _plan(
        remote, None, [64 << 20] * 8)
