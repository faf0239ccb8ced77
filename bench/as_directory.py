"""What verifying a local checkpoint in ``as_directory()`` costs, against a raw read.

Usage::

    python bench/as_directory.py [--size-mib 256] [--files 8] [--repeat 3] [--calls 200]

Commits a local checkpoint of ``--files`` random files totalling ``--size-mib`` MiB (data
and manifest, as a SYNC report leaves it), warms the page cache, then times:

* reference: a raw read of the same files (``readinto`` into one reused 1 MiB buffer, no
  hashing), best of ``--repeat``;
* the first ``as_directory()`` of the checkpoint in a process: every file is verified
  against the manifest (sizes and xxh3-128 checksums); best of ``--repeat``, the
  process's memory of verified checkpoints cleared before each;
* a repeated ``as_directory()``: the checkpoint is remembered, so the call reads the
  manifest and ``lstat``s each file; median of ``--calls`` calls.

Prints the figures with the ratios against the raw read. ``run(args)`` returns them as
rows for ``bench/run_all.py`` (``quick``: 64 MiB, 2 repeats, 50 calls).
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import make_checkpoint_dir

from cairn._src.checkpoint.checkpoint import Checkpoint
from cairn._src.checkpoint.manifest import Manifest, write_manifest
from cairn._src.checkpoint.verified import VERIFIED
from cairn._src.storage.location import resolve
from cairn._src.storage.transfer import upload_directory


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=float, default=256.0, help="total size (MiB)")
    parser.add_argument("--files", type=int, default=8, help="number of files")
    parser.add_argument("--repeat", type=int, default=3, help="runs of the full reads (best)")
    parser.add_argument("--calls", type=int, default=200, help="repeated calls (median)")
    parser.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    return parser.parse_args(argv)


def raw_read(root: str) -> int:
    """Read every file under ``root`` once, as a loader that trusts the disk would."""
    buffer = memoryview(bytearray(1 << 20))
    total = 0
    for directory, _, names in os.walk(root):
        for name in names:
            with open(os.path.join(directory, name), "rb", buffering=0) as f:
                while count := f.readinto(buffer):
                    total += count
    return total


def best_of(repeat: int, prepare: Callable[[], None], action: Callable[[], Any]) -> float:
    best = float("inf")
    for _ in range(repeat):
        prepare()
        started = time.perf_counter()
        action()
        best = min(best, time.perf_counter() - started)
    return best


def enter(checkpoint: Checkpoint) -> None:
    with checkpoint.as_directory():
        pass


def measure(size_mib: float, num_files: int, repeat: int, calls: int,
            scratch: str) -> dict[str, float]:
    src = os.path.join(scratch, "src")
    stored = os.path.join(scratch, "checkpoint_000001")
    make_checkpoint_dir(src, size_mib, num_files)
    location = resolve(stored)
    write_manifest(location, Manifest(files=upload_directory(src, location), report_index=1))
    raw_read(stored)  # Warm the page cache: every run reads from memory.
    reference = best_of(repeat, lambda: None, lambda: raw_read(stored))
    checkpoint = Checkpoint(stored)
    first = best_of(repeat, VERIFIED.clear, lambda: enter(checkpoint))
    enter(checkpoint)
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        enter(checkpoint)
        samples.append(time.perf_counter() - started)
    return {"reference": reference, "first": first, "repeated": statistics.median(samples)}


def run(args: Any = None) -> list[dict[str, Any]]:
    """Rows ``{benchmark, metric, cairn, reference, ratio, unit, ...}`` for the harness.

    ``args`` is this script's namespace, a list of its command-line arguments, or
    ``bench/run_all.py``'s namespace.
    """
    if args is None or isinstance(args, (list, tuple)):
        args = parse_args(args)
    quick = bool(getattr(args, "quick", False))
    size_mib = float(getattr(args, "size_mib", 64.0 if quick else 256.0))
    num_files = int(getattr(args, "files", 8))
    repeat = int(getattr(args, "repeat", 2 if quick else 3))
    calls = int(getattr(args, "calls", 50 if quick else 200))
    scratch = tempfile.mkdtemp(prefix="cairn-bench-as-directory-",
                               dir=getattr(args, "dir", None))
    try:
        figures = measure(size_mib, num_files, repeat, calls, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    size = f"{size_mib:g} MiB ({num_files} files)"
    rows = []
    for key, what in (("first", f"first as_directory(), verifies, best of {repeat}"),
                      ("repeated", f"repeated as_directory(), median of {calls}")):
        rows.append({
            "benchmark": "as_directory",
            "metric": f"{what}, {size}",
            "cairn": figures[key],
            "reference": figures["reference"],
            "ratio": figures[key] / figures["reference"],
            "unit": "s",
            "reference_name": "raw read of the files",
            "note": "local checkpoint, warm page cache; verified once per process",
        })
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    rows = run(args)
    print(f"{'metric':<66} {'cairn s':>10} {'raw read s':>11} {'ratio':>8}")
    for row in rows:
        print(f"{row['metric']:<66} {row['cairn']:>10.5f} {row['reference']:>11.5f} "
              f"{row['ratio']:>7.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
