"""A checkpoint of many small files: upload, verify and restore against
``pyarrow.fs.copy_files`` of the same tree, in one run.

Usage::

    python bench/small_files.py [--files 100000] [--file-kib 1] [--per-dir 1000]

Writes ``--files`` random files of ``--file-kib`` KiB (``--per-dir`` per directory) and
times, local storage to local storage:

* upload: ``upload_directory`` (what a SYNC ``report()`` does with the data: copy with
  xxh3-128 checksums) plus writing the manifest; the reference is
  ``pyarrow.fs.copy_files`` of the same tree (no checksums);
* verify: ``verify_directory`` of the stored checkpoint (``cairn verify``); the reference
  is the same ``copy_files`` (one full read of every file, plus writes);
* restore: ``download_directory`` with verification (``to_directory()``); reference the
  same ``copy_files``.

One run each (a run of 100,000 files takes tens of seconds); ``run(args)`` returns the
rows for ``bench/run_all.py`` (``quick``: 10,000 files).
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
    parser.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    return parser.parse_args(argv)


def make_tree(root: str, files: int, size: int, per_dir: int) -> None:
    for i in range(files):
        directory = os.path.join(root, f"d{i // per_dir:04d}")
        if i % per_dir == 0:
            os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, f"f{i:06d}.bin"), "wb") as f:
            f.write(os.urandom(size))


def timed(action: Callable[[], Any]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def copy_files(src: str, dest: str) -> float:
    shutil.rmtree(dest, ignore_errors=True)
    local = pafs.LocalFileSystem()
    return timed(lambda: pafs.copy_files(src, dest, source_filesystem=local,
                                         destination_filesystem=local, use_threads=True))


def measure(files: int, size: int, per_dir: int, scratch: str) -> dict[str, float]:
    src = os.path.join(scratch, "src")
    make_tree(src, files, size, per_dir)
    stored = resolve(os.path.join(scratch, "run", "checkpoint_000001"))
    figures = {"reference_upload": copy_files(src, os.path.join(scratch, "copy1"))}

    def upload() -> None:
        entries = upload_directory(src, stored, retry=RETRY)
        write_manifest(stored, Manifest(files=entries, report_index=1), RETRY)

    figures["upload"] = timed(upload)
    manifest = read_manifest(stored, RETRY)
    assert manifest is not None and len(manifest.files) == files
    figures["reference_verify"] = copy_files(stored.path, os.path.join(scratch, "copy2"))
    figures["verify"] = timed(lambda: verify_directory(stored, manifest.files, retry=RETRY))
    figures["reference_restore"] = copy_files(stored.path, os.path.join(scratch, "copy3"))
    restored = os.path.join(scratch, "restored")
    figures["restore"] = timed(lambda: download_directory(stored, restored,
                                                          files=manifest.files, retry=RETRY))
    return figures


def run(args: Any = None) -> list[dict[str, Any]]:
    """Rows ``{benchmark, metric, cairn, reference, ratio, unit, ...}`` for the harness."""
    if args is None or isinstance(args, (list, tuple)):
        args = parse_args(args)
    quick = bool(getattr(args, "quick", False))
    files = int(getattr(args, "files", 10_000 if quick else 100_000))
    size = int(float(getattr(args, "file_kib", 1.0)) * 1024)
    per_dir = int(getattr(args, "per_dir", 1000))
    scratch = tempfile.mkdtemp(prefix="cairn-bench-small-", dir=getattr(args, "dir", None))
    try:
        figures = measure(files, size, per_dir, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
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
            "note": "local -> local, one run each; Cairn checksums every file (xxh3-128)",
        })
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    print_table(run(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
