"""A checkpoint of many small files: upload, verify and restore against
``pyarrow.fs.copy_files`` of the same tree, in one run.

Usage::

    python bench/small_files.py [--files 100000] [--file-kib 1] [--per-dir 1000] [--repeat 3]
                                [--warmup 1] [--in-process]

Writes ``--files`` random files of ``--file-kib`` KiB (``--per-dir`` per directory) and
times, local storage to local storage:

* upload: ``upload_directory`` (what a SYNC ``report()`` does with the data: copy with
  xxh3-128 checksums) plus writing the manifest; the reference is
  ``pyarrow.fs.copy_files`` of the same tree (no checksums);
* verify: ``verify_directory`` of the stored checkpoint (``cairn verify``); the reference
  is the same ``copy_files`` (one full read of every file, plus writes);
* restore: ``download_directory`` with verification (``to_directory()``) into the
  directory the reference copies into, emptied first as it is for the reference; the
  reference the same ``copy_files``.

The median of ``--repeat`` rounds (3; a round of 100,000 files takes about half a
minute) after ``--warmup`` untimed ones (1: the first call of each side in a process pays
for its imports and first allocations, a large part of a 1,000-file figure), Cairn and
the reference taking turns to go first, each after ``os.sync()`` (the
disk's write-back of one phase must not land in the next); ``run(args)`` returns the rows
for ``bench/run_all.py`` (``quick``: 10,000 files, one round). ``--in-process`` adds a
row per phase for the same call with ``max_workers=1``: the in-process
directory-at-a-time path alone, without copy processes, in the same rounds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow.fs as pafs

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import print_table

from cairn._src.checkpoint.manifest import (
    Manifest,
    read_manifest,
    write_manifest,
)
from cairn._src.storage.location import resolve
from cairn._src.storage.retry import RetryPolicy
from cairn._src.storage.transfer import (
    download_directory,
    upload_directory,
    verify_directory,
)

RETRY = RetryPolicy()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=100_000, help="number of files")
    parser.add_argument("--file-kib", type=float, default=1.0, help="size of each (KiB)")
    parser.add_argument("--per-dir", type=int, default=1000, help="files per directory")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (median reported)")
    parser.add_argument("--warmup", type=int, default=1,
                        help="untimed rounds first (every phase of both sides, discarded)")
    parser.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    parser.add_argument("--in-process", action="store_true",
                        help="also time each phase with max_workers=1 (the in-process "
                             "directory-at-a-time path alone, no copy processes)")
    return parser.parse_args(argv)


def make_tree(root: str, files: int, size: int, per_dir: int) -> None:
    for i in range(files):
        directory = os.path.join(root, f"d{i // per_dir:04d}")
        if i % per_dir == 0:
            os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, f"f{i:06d}.bin"), "wb") as f:
            f.write(os.urandom(size))


def timed(action: Callable[[], Any]) -> float:
    # Written back first: no phase pays for the dirty pages of the one before it.
    os.sync()
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def copy_files(src: str, dest: str) -> float:
    shutil.rmtree(dest, ignore_errors=True)
    local = pafs.LocalFileSystem()
    return timed(lambda: pafs.copy_files(src, dest, source_filesystem=local,
                                         destination_filesystem=local, use_threads=True))


def measure(files: int, size: int, per_dir: int, scratch: str,
            repeat: int = 1, in_process: bool = False, warmup: int = 0,
            ) -> dict[str, list[float]]:
    """Each figure ``repeat`` times; within a round, Cairn and the reference take turns
    going first, and every output is deleted before the next round. ``in_process`` adds
    ``<phase>_in_process``: the same call with ``max_workers=1``, which copies every file
    on the calling thread (no copy process), in the same rounds."""
    src = os.path.join(scratch, "src")
    make_tree(src, files, size, per_dir)
    figures: dict[str, list[float]] = {}
    for round_ in range(-warmup, repeat):
        stored = resolve(os.path.join(scratch, "run", "checkpoint_000001"))

        def upload(stored: Any = stored, workers: int | None = None) -> None:
            entries = upload_directory(src, stored, retry=RETRY, max_workers=workers)
            write_manifest(stored, Manifest(files=entries, report_index=1), RETRY)

        def verify(stored: Any = stored, workers: int | None = None) -> None:
            manifest = read_manifest(stored, RETRY)
            assert manifest is not None and len(manifest.files) == files
            verify_directory(stored, manifest.files, retry=RETRY, max_workers=workers)

        def restore(stored: Any = stored, workers: int | None = None) -> None:
            manifest = read_manifest(stored, RETRY)
            assert manifest is not None
            download_directory(stored, os.path.join(scratch, "copy"),
                               files=manifest.files, retry=RETRY, max_workers=workers)

        def emptied(action: Callable[[], Any]) -> float:
            # Each of Cairn's phases starts, as each of the reference's does, with "copy"
            # emptied; the restore writes there. A file system that has just freed a tree
            # of these files makes the next one faster than one that must grow (tmpfs:
            # 0.97-1.05 s against 1.2-2.0 s for the same restore into a name not used
            # before, as this benchmark did until 2026-12-05).
            shutil.rmtree(os.path.join(scratch, "copy"), ignore_errors=True)
            return timed(action)

        for key, action, reference_source in (("upload", upload, src),
                                              ("verify", verify, stored.path),
                                              ("restore", restore, stored.path)):
            turns = [(key, lambda action=action: emptied(action)),
                     (f"reference_{key}", lambda source=reference_source: copy_files(
                         source, os.path.join(scratch, "copy")))]
            if in_process:
                turns.insert(1, (f"{key}_in_process", lambda action=action: emptied(
                    lambda: action(workers=1))))
            for name, take in turns if round_ % 2 == 0 else turns[::-1]:
                if key == "upload" and not name.startswith("reference"):
                    # Each upload writes the checkpoint anew, as the first one does.
                    shutil.rmtree(os.path.join(scratch, "run"), ignore_errors=True)
                seconds = take()
                if round_ >= 0:  # a warm-up round's figures are dropped
                    figures.setdefault(name, []).append(seconds)
        for name in ("run", "copy"):
            shutil.rmtree(os.path.join(scratch, name), ignore_errors=True)
    return figures


def run(args: Any = None) -> list[dict[str, Any]]:
    """Rows ``{benchmark, metric, cairn, reference, ratio, unit, ...}`` for the harness."""
    if args is None or isinstance(args, (list, tuple)):
        args = parse_args(args)
    quick = bool(getattr(args, "quick", False))
    files = int(getattr(args, "files", 10_000 if quick else 100_000))
    size = int(float(getattr(args, "file_kib", 1.0)) * 1024)
    per_dir = int(getattr(args, "per_dir", 1000))
    repeat = int(getattr(args, "repeat", 1 if quick else 3))
    warmup = int(getattr(args, "warmup", 1))
    scratch = tempfile.mkdtemp(prefix="cairn-bench-small-", dir=getattr(args, "dir", None))
    try:
        runs = measure(files, size, per_dir, scratch, repeat,
                       bool(getattr(args, "in_process", False)), warmup)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    figures = {name: statistics.median(values) for name, values in runs.items()}
    what = f"{files:,} files of {size / 1024:g} KiB"
    rows = []
    for key, metric in (("upload", f"upload + manifest, {what}"),
                        ("verify", f"verify, {what}"),
                        ("restore", f"restore (verified), {what}")):
        rows.append({
            "benchmark": "small_files",
            "metric": metric,
            "cairn": figures[key],
            "reference": figures[f"reference_{key}"],
            "ratio": figures[key] / figures[f"reference_{key}"],
            "unit": "s",
            "reference_name": "pyarrow.fs.copy_files, same run",
            "note": (f"local -> local, median of {repeat} (Cairn "
                     f"{', '.join(f'{v:.2f}' for v in runs[key])}; reference "
                     f"{', '.join(f'{v:.2f}' for v in runs[f'reference_{key}'])} s), "
                     f"after {warmup} untimed round(s), taking turns to go first, "
                     "os.sync() before each; Cairn checksums every file (xxh3-128)"),
        })
        if f"{key}_in_process" in figures:
            rows.append({
                "benchmark": "small_files",
                "metric": f"{metric}, in-process path alone (max_workers=1)",
                "cairn": figures[f"{key}_in_process"],
                "reference": figures[f"reference_{key}"],
                "ratio": figures[f"{key}_in_process"] / figures[f"reference_{key}"],
                "unit": "s",
                "reference_name": "pyarrow.fs.copy_files, same run",
                "note": (f"same rounds as the row above (Cairn "
                         f"{', '.join(f'{v:.2f}' for v in runs[f'{key}_in_process'])} s)"),
            })
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    print_table(run(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
