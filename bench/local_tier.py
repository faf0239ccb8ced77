"""A restore from the node's local tier against a restore of the same checkpoint from S3.

Usage::

    python bench/local_tier.py [--size-mib 1024] [--files 4] [--repeat 2]

Starts a moto S3 server on 127.0.0.1 (its own process), commits a checkpoint of
``--files`` random files totalling ``--size-mib`` MiB there (upload and manifest), copies
the same files into a local tier as a worker does after its upload
(``CheckpointConfig(local_tier_bytes=...)``), then times, best of ``--repeat``, into a
fresh directory each time:

* the restore from the tier (``LocalTier.restore``: every file checked against the
  manifest's checksum as it is copied, what ``get_checkpoint().as_directory()`` does in a
  worker on that node);
* the reference: the verified restore from S3 (``download_directory``, what the same call
  does without a tier).

The tier lives in the temp directory (``--dir`` to choose; a ``/dev/shm`` path measures a
RAM tier). ``run(args)`` returns the rows for ``bench/run_all.py`` (``quick``: 256 MiB,
1 repeat). Target: at most 0.2x.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import make_checkpoint_dir, print_table
from s3_transfer import location, moto_server

from cairn._src.checkpoint.local_tier import LocalTier
from cairn._src.checkpoint.manifest import Manifest, write_manifest
from cairn._src.storage.retry import RetryPolicy
from cairn._src.storage.transfer import download_directory, upload_directory

RETRY = RetryPolicy()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=float, default=1024.0, help="checkpoint size (MiB)")
    parser.add_argument("--files", type=int, default=4, help="number of files")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each (best)")
    parser.add_argument("--dir", default=None, help="scratch and tier directory")
    return parser.parse_args(argv)


def best(repeat: int, out: str, action: Callable[[], Any]) -> float:
    times = []
    for _ in range(repeat):
        shutil.rmtree(out, ignore_errors=True)
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return min(times)


def measure(size_mib: float, files: int, repeat: int, scratch: str) -> dict[str, float]:
    src = os.path.join(scratch, "src")
    make_checkpoint_dir(src, size_mib, files)
    out = os.path.join(scratch, "out")
    with moto_server() as endpoint:
        run = location(endpoint, "run")
        stored = run.join("checkpoint_000001")
        entries = upload_directory(src, stored, retry=RETRY)
        manifest = Manifest(files=entries, report_index=1)
        write_manifest(stored, manifest)
        tier = LocalTier.for_run(run, os.path.join(scratch, "tier"), 1 << 40)
        assert tier is not None
        assert tier.add(1, "checkpoint_000001", src, entries)

        def from_tier() -> None:
            assert tier.restore(stored, manifest, out, RETRY)

        def from_s3() -> None:
            download_directory(stored, out, files=entries, verify=True, retry=RETRY)

        return {"tier": best(repeat, out, from_tier), "s3": best(repeat, out, from_s3)}


def run(args: Any = None) -> list[dict[str, Any]]:
    """Rows ``{benchmark, metric, cairn, reference, ratio, unit, ...}`` for the harness."""
    if args is None or isinstance(args, (list, tuple)):
        args = parse_args(args)
    quick = bool(getattr(args, "quick", False))
    size_mib = float(getattr(args, "size_mib", 256.0 if quick else 1024.0))
    files = int(getattr(args, "files", 4))
    repeat = int(getattr(args, "repeat", 1 if quick else 2))
    scratch = tempfile.mkdtemp(prefix="cairn-bench-tier-", dir=getattr(args, "dir", None))
    try:
        figures = measure(size_mib, files, repeat, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return [{
        "benchmark": "local_tier",
        "metric": f"restore from the local tier, {size_mib:g} MiB ({files} files)",
        "cairn": figures["tier"], "reference": figures["s3"],
        "ratio": figures["tier"] / figures["s3"], "unit": "s",
        "reference_name": "verified restore from S3 (moto on 127.0.0.1)",
        "note": f"both verified against the manifest; best of {repeat}; tier in the temp "
                "directory",
    }]


def main(argv: Sequence[str] | None = None) -> int:
    print_table(run(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
