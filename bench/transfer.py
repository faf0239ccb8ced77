"""Checksummed directory transfers against a plain ``pyarrow.fs.copy_files``.

Usage::

    python bench/transfer.py [--size-mib 256] [--files 8] [--repeat 3] [--workers 8]

Creates a directory of ``--files`` random files totalling ``--size-mib`` MiB, warms the
page cache, then times (best of ``--repeat``, destinations removed between runs):

* reference: ``pyarrow.fs.copy_files`` local -> local (no checksums);
* Cairn ``upload_directory`` local -> local storage, computing xxh3-128 checksums;
* Cairn ``download_directory`` local storage -> local, verifying sizes and checksums.

Prints a table and the ratios Cairn / reference (target: at most 1.5). ``run(args)``
returns the same figures as rows for ``bench/run_all.py``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow.fs as pafs

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import make_checkpoint_dir

from cairn._src.storage.location import resolve
from cairn._src.storage.transfer import (
    FileEntry,
    download_directory,
    upload_directory,
)

TARGET_RATIO = 1.5


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=float, default=256.0, help="total size (MiB)")
    parser.add_argument("--files", type=int, default=8, help="number of files")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement (best)")
    parser.add_argument("--workers", type=int, default=8, help="Cairn's max_workers")
    parser.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    return parser.parse_args(argv)


def warm(root: str) -> None:
    """Read every file once so that all runs start from a warm page cache."""
    for name in os.listdir(root):
        with open(os.path.join(root, name), "rb", buffering=0) as f:
            while f.read(8 << 20):
                pass


def best_of(repeat: int, prepare: Callable[[], None], action: Callable[[], Any]) -> float:
    best = float("inf")
    for _ in range(repeat):
        prepare()
        started = time.perf_counter()
        action()
        best = min(best, time.perf_counter() - started)
    return best


def measure(
    size_mib: float, num_files: int, repeat: int, workers: int, scratch: str
) -> dict[str, float]:
    src = os.path.join(scratch, "src")
    stored = os.path.join(scratch, "stored")
    out = os.path.join(scratch, "out")
    make_checkpoint_dir(src, size_mib, num_files)
    warm(src)
    local = pafs.LocalFileSystem()

    def clear(path: str) -> Callable[[], None]:
        def prepare() -> None:
            shutil.rmtree(path, ignore_errors=True)
            os.makedirs(path)  # copy_files does not create the destination directory.

        return prepare

    # One untimed copy first, so that no measurement pays for first-touch costs.
    clear(out)()
    pafs.copy_files(src, out, source_filesystem=local, destination_filesystem=local)
    reference = best_of(
        repeat, clear(out),
        lambda: pafs.copy_files(src, out, source_filesystem=local, destination_filesystem=local),
    )
    entries: dict[str, FileEntry] = {}

    def upload() -> None:
        entries.update(upload_directory(src, resolve(stored), max_workers=workers))

    upload_s = best_of(repeat, clear(stored), upload)
    warm(stored)
    download_s = best_of(
        repeat, clear(out),
        lambda: download_directory(resolve(stored), out, files=entries, max_workers=workers),
    )
    return {"reference": reference, "upload": upload_s, "download": download_s}


def run(args: Any = None) -> list[dict[str, Any]]:
    """Rows ``{benchmark, metric, cairn, reference, ratio, unit, ...}`` for the harness.

    ``args`` is this script's namespace, a list of its command-line arguments, or
    ``bench/run_all.py``'s namespace (``quick`` halves the repeats).
    """
    if args is None or isinstance(args, (list, tuple)):
        args = parse_args(args)
    size_mib = float(getattr(args, "size_mib", 256.0))
    num_files = int(getattr(args, "files", 8))
    repeat = int(getattr(args, "repeat", 2 if getattr(args, "quick", False) else 3))
    workers = int(getattr(args, "workers", 8))
    scratch = tempfile.mkdtemp(prefix="cairn-bench-transfer-", dir=getattr(args, "dir", None))
    try:
        figures = measure(size_mib, num_files, repeat, workers, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    size = f"{size_mib:g} MiB ({num_files} files)"
    rows = []
    for key, what in (("upload", "upload_directory, xxh3-128 checksums"),
                      ("download", "download_directory, verified")):
        rows.append(
            {
                "benchmark": "transfer",
                "metric": f"{what}, {size}, best of {repeat}",
                "cairn": figures[key],
                "reference": figures["reference"],
                "ratio": figures[key] / figures["reference"],
                "unit": "s",
                "reference_name": "pyarrow.fs.copy_files",
                "note": f"target <= {TARGET_RATIO}x; local -> local, warm page cache",
            }
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    rows = run(args)
    mib = args.size_mib
    print(f"{'metric':<62} {'cairn s':>9} {'copy_files s':>13} {'ratio':>7} {'MiB/s':>8}")
    for row in rows:
        print(
            f"{row['metric']:<62} {row['cairn']:>9.3f} {row['reference']:>13.3f} "
            f"{row['ratio']:>6.2f}x {mib / row['cairn']:>8.0f}"
        )
    ok = all(row["ratio"] <= TARGET_RATIO for row in rows)
    print(f"target: ratio <= {TARGET_RATIO} -> {'met' if ok else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
