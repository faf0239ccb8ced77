"""What the driver reads of the resume checkpoint at an attempt's start, by
``CheckpointConfig.verify_on_resume``, against a raw read of the same files.

Usage::

    python bench/resume_check.py [--size-mib 1024] [--files 8] [--repeat 3]

Commits a local checkpoint of ``--files`` random files totalling ``--size-mib`` MiB into a
run directory (data and manifest, as a SYNC report leaves it), warms the page cache, then
times ``CheckpointManager.choose_resume()``, best of ``--repeat``:

* ``"full"``: every byte read and checksummed on the driver (the behaviour before the
  workers verified as they restore);
* ``"sizes"`` (the default): the manifest, and every file opened as a regular file of the
  recorded size, nothing read;
* a checkpoint this driver committed itself, right after a worker crash: not read at all.

The reference is a raw read of the files (``readinto`` into one reused 1 MiB buffer, no
hashing), best of ``--repeat``. With a warm page cache the raw read is a memory copy; on a
cold cache or remote storage every byte the driver skips is a byte not fetched twice.
``run(args)`` returns the rows for ``bench/run_all.py`` (``quick``: 256 MiB, 2 repeats).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import make_checkpoint_dir, print_table
from as_directory import best_of, raw_read

from cairn._src.checkpoint.index import rebuild_index
from cairn._src.checkpoint.manager import CheckpointManager
from cairn._src.checkpoint.manifest import Manifest, write_manifest
from cairn._src.config.run import CheckpointConfig
from cairn._src.run.layout import METRICS_DIR
from cairn._src.run.segment_log import SegmentLog
from cairn._src.storage.location import StorageLocation, resolve
from cairn._src.storage.retry import RetryPolicy
from cairn._src.storage.transfer import upload_directory

RETRY = RetryPolicy()
NAME = "checkpoint_000001"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=float, default=1024.0, help="total size (MiB)")
    parser.add_argument("--files", type=int, default=8, help="number of files")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each (best)")
    parser.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    return parser.parse_args(argv)


def choose(run: StorageLocation, mode: str, committed_here: bool) -> None:
    config = CheckpointConfig(verify_on_resume=mode)  # type: ignore[arg-type]
    manager = CheckpointManager(run, config, RETRY, rebuild_index(run, RETRY),
                                SegmentLog(run.join(METRICS_DIR), RETRY))
    if committed_here:
        manager.committed_here.add(NAME)
    chosen = manager.choose_resume()
    assert chosen is not None and chosen.dir_name == NAME


def measure(size_mib: float, num_files: int, repeat: int, scratch: str) -> dict[str, float]:
    src = os.path.join(scratch, "src")
    run = resolve(os.path.join(scratch, "run"))
    stored = run.join(NAME)
    make_checkpoint_dir(src, size_mib, num_files)
    write_manifest(stored, Manifest(files=upload_directory(src, stored), report_index=1))
    shutil.rmtree(src)
    raw_read(stored.path)  # Warm the page cache: every run reads from memory.
    return {
        "reference": best_of(repeat, lambda: None, lambda: raw_read(stored.path)),
        "full": best_of(repeat, lambda: None, lambda: choose(run, "full", False)),
        "sizes": best_of(repeat, lambda: None, lambda: choose(run, "sizes", False)),
        "committed_here": best_of(repeat, lambda: None, lambda: choose(run, "sizes", True)),
    }


def run(args: Any = None) -> list[dict[str, Any]]:
    """Rows ``{benchmark, metric, cairn, reference, ratio, unit, ...}`` for the harness."""
    if args is None or isinstance(args, (list, tuple)):
        args = parse_args(args)
    quick = bool(getattr(args, "quick", False))
    size_mib = float(getattr(args, "size_mib", 256.0 if quick else 1024.0))
    num_files = int(getattr(args, "files", 8))
    repeat = int(getattr(args, "repeat", 2 if quick else 3))
    scratch = tempfile.mkdtemp(prefix="cairn-bench-resume-", dir=getattr(args, "dir", None))
    try:
        figures = measure(size_mib, num_files, repeat, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    size = f"{size_mib:g} MiB ({num_files} files)"
    rows = []
    for key, what in (("full", "resume check, verify_on_resume='full'"),
                      ("sizes", "resume check, verify_on_resume='sizes' (default)"),
                      ("committed_here", "resume check, committed by this driver")):
        rows.append({
            "benchmark": "resume_check",
            "metric": f"{what}, {size}",
            "cairn": figures[key],
            "reference": figures["reference"],
            "ratio": figures[key] / figures["reference"],
            "unit": "s",
            "reference_name": "raw read of the files",
            "note": f"CheckpointManager.choose_resume(), best of {repeat}; local, warm page "
                    "cache",
        })
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    print_table(run(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
