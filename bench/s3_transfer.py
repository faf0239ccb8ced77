"""Large files to and from S3: Cairn's checksummed upload and verified download against
``pyarrow.fs.copy_files`` and ``boto3`` with its default transfer config, in one run.

Usage::

    python bench/s3_transfer.py [--size-mib 1024] [--files 1] [--repeat 2]

Starts a moto S3 server on 127.0.0.1 in its own process (so that its work does not share
this process's GIL with the clients), writes ``--files`` random files totalling
``--size-mib`` MiB, and times, best of ``--repeat``:

* upload: ``upload_directory`` (what a SYNC ``report()`` does with the data, xxh3-128
  checksums as the bytes stream) against ``pyarrow.fs.copy_files`` of the same directory
  to the same server (no checksums), and ``boto3``'s ``upload_file`` with its default
  ``TransferConfig`` (8 MiB parts, 10 threads);
* download: ``download_directory`` with verification (``to_directory()``) against
  ``copy_files`` back, and ``boto3``'s ``download_file``.

Cairn runs with ``TransferConfig(part_size=--part-mib, max_concurrency=--concurrency)``
(the defaults: 16 MiB, 8), and once more with ``max_concurrency=1`` (one stream per file,
as before ranged reads) for the download, to show what the parallel ranges bring.

Cairn's notes also give the memory held at peak during one more upload and download
(pyarrow's pool, sampled, plus Python's traced allocations), to show that transfers
stream rather than buffer whole files. ``run(args)`` returns the rows for
``bench/run_all.py`` (``quick``: 64 MiB, 1 repeat).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import make_checkpoint_dir, print_table

from cairn._src.storage.checksum import BUFFERS
from cairn._src.storage.location import StorageLocation, resolve
from cairn._src.storage.retry import RetryPolicy
from cairn._src.storage.transfer import download_directory, upload_directory
from cairn._src.storage.tuning import TransferConfig

RETRY = RetryPolicy()
BUCKET = "cairn-bench"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=float, default=1024.0, help="total size (MiB)")
    parser.add_argument("--files", type=int, default=1, help="number of files")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each (best)")
    parser.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    parser.add_argument("--part-mib", type=int, default=16, help="TransferConfig.part_size")
    parser.add_argument("--concurrency", type=int, default=8,
                        help="TransferConfig.max_concurrency")
    parser.add_argument("--upload-only", action="store_true",
                        help="skip the downloads: moto reads a whole object for every ranged "
                             "GET, so parallel ranges of one object of 1 GiB time out there")
    return parser.parse_args(argv)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def moto_server() -> Iterator[str]:
    """``host:port`` of a moto S3 server in a child process, with bucket ``BUCKET``."""
    # Signed requests: moto stores an anonymous request's aws-chunked framing as the object.
    os.environ.update({"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"})
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    endpoint = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the moto server did not start") from None
                time.sleep(0.05)
        client(endpoint).create_bucket(Bucket=BUCKET)
        yield endpoint
    finally:
        server.terminate()
        server.wait(timeout=30)


def client(endpoint: str) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=f"http://{endpoint}", region_name="us-east-1",
                        aws_access_key_id="bench", aws_secret_access_key="bench")


def arrow_s3(endpoint: str) -> pafs.S3FileSystem:
    return pafs.S3FileSystem(endpoint_override=endpoint, scheme="http", region="us-east-1",
                             access_key="bench", secret_key="bench")


def location(endpoint: str, prefix: str) -> StorageLocation:
    return resolve(f"s3://{BUCKET}/{prefix}?endpoint_override={endpoint}&scheme=http"
                   "&region=us-east-1")


def measured(action: Callable[[], Any]) -> tuple[float, int]:
    """(seconds, peak bytes held during ``action``: pyarrow's memory pool, sampled every
    2 ms by a thread, plus Python's own allocations, traced). Cairn's copy buffers kept
    from earlier transfers are dropped first, so that the ones ``action`` uses count."""
    BUFFERS.clear()
    baseline = pa.total_allocated_bytes()
    peak = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.002):
            peak[0] = max(peak[0], pa.total_allocated_bytes() - baseline)

    sampler = threading.Thread(target=sample, daemon=True)
    tracemalloc.start()
    sampler.start()
    started = time.perf_counter()
    try:
        action()
        elapsed = time.perf_counter() - started
    finally:
        stop.set()
        sampler.join()
        python_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return elapsed, max(0, peak[0]) + python_peak


def best(repeat: int, reset: Callable[[], None], action: Callable[[], Any]) -> float:
    times = []
    for _ in range(repeat):
        reset()
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return min(times)


def measure(size_mib: float, num_files: int, repeat: int, scratch: str,
            endpoint: str, config: TransferConfig,
            upload_only: bool = False) -> dict[str, float]:
    src = os.path.join(scratch, "src")
    make_checkpoint_dir(src, size_mib, num_files)
    names = sorted(os.listdir(src))
    s3 = arrow_s3(endpoint)
    boto = client(endpoint)
    local = pafs.LocalFileSystem()
    out = os.path.join(scratch, "out")

    def clear_out() -> None:
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)

    def cairn_up() -> None:
        upload_directory(src, location(endpoint, "cairn"), retry=RETRY, transfer=config)

    def arrow_up() -> None:
        pafs.copy_files(src, f"{BUCKET}/arrow", source_filesystem=local,
                        destination_filesystem=s3, use_threads=True)

    def boto_up() -> None:
        for name in names:
            boto.upload_file(os.path.join(src, name), BUCKET, f"boto/{name}")

    figures = {
        "upload_cairn": best(repeat, lambda: None, cairn_up),
        "upload_copy_files": best(repeat, lambda: None, arrow_up),
        "upload_boto3": best(repeat, lambda: None, boto_up),
    }
    if upload_only:
        figures["upload_cairn_peak"] = measured(cairn_up)[1]
        return figures
    entries = upload_directory(src, location(endpoint, "cairn"), retry=RETRY, transfer=config)

    def cairn_down() -> None:
        download_directory(location(endpoint, "cairn"), out, files=entries, retry=RETRY,
                           transfer=config)

    def cairn_down_one_stream() -> None:
        download_directory(location(endpoint, "cairn"), out, files=entries, retry=RETRY,
                           transfer=TransferConfig(part_size=config.part_size,
                                                   max_concurrency=1))

    def arrow_down() -> None:
        pafs.copy_files(f"{BUCKET}/arrow", out, source_filesystem=s3,
                        destination_filesystem=local, use_threads=True)

    def boto_down() -> None:
        for name in names:
            boto.download_file(BUCKET, f"boto/{name}", os.path.join(out, name))

    figures["download_cairn"] = best(repeat, clear_out, cairn_down)
    figures["download_one_stream"] = best(repeat, clear_out, cairn_down_one_stream)
    figures["download_copy_files"] = best(repeat, clear_out, arrow_down)
    figures["download_boto3"] = best(repeat, clear_out, boto_down)
    clear_out()
    figures["upload_cairn_peak"] = measured(cairn_up)[1]
    figures["download_cairn_peak"] = measured(cairn_down)[1]
    return figures


def run(args: Any = None) -> list[dict[str, Any]]:
    """Rows ``{benchmark, metric, cairn, reference, ratio, unit, ...}`` for the harness."""
    if args is None or isinstance(args, (list, tuple)):
        args = parse_args(args)
    quick = bool(getattr(args, "quick", False))
    size_mib = float(getattr(args, "size_mib", 64.0 if quick else 1024.0))
    num_files = int(getattr(args, "files", 1))
    repeat = int(getattr(args, "repeat", 1 if quick else 2))
    config = TransferConfig(part_size=int(getattr(args, "part_mib", 16)) << 20,
                            max_concurrency=int(getattr(args, "concurrency", 8)))
    scratch = tempfile.mkdtemp(prefix="cairn-bench-s3-", dir=getattr(args, "dir", None))
    try:
        with moto_server() as endpoint:
            figures = measure(size_mib, num_files, repeat, scratch, endpoint, config,
                              bool(getattr(args, "upload_only", False)))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    size = f"{size_mib:g} MiB ({num_files} {'file' if num_files == 1 else 'files'})"
    rows = []
    tuned = (f"TransferConfig(part_size={config.part_size >> 20} MiB, "
             f"max_concurrency={config.max_concurrency})")
    for way, what in (("upload", "S3 upload (checksummed)"),
                      ("download", "S3 download (verified)")):
        if f"{way}_cairn" not in figures:
            continue
        peak = figures[f"{way}_cairn_peak"] / (1 << 20)
        for reference, name in (("copy_files", "pyarrow.fs.copy_files"),
                                ("boto3", "boto3 default TransferConfig")):
            rows.append({
                "benchmark": "s3_transfer",
                "metric": f"{what}, {size}, vs {reference}",
                "cairn": figures[f"{way}_cairn"],
                "reference": figures[f"{way}_{reference}"],
                "ratio": figures[f"{way}_cairn"] / figures[f"{way}_{reference}"],
                "unit": "s",
                "reference_name": name,
                "note": f"{tuned}; moto on 127.0.0.1 in its own process; best of {repeat}; "
                        f"memory held at peak during Cairn's {way}: {peak:.0f} MiB (pyarrow "
                        "pool and Python allocations)",
            })
    if "download_cairn" not in figures:
        return rows
    rows.append({
        "benchmark": "s3_transfer",
        "metric": f"S3 download (verified), {size}, ranged parts vs one stream per file",
        "cairn": figures["download_cairn"],
        "reference": figures["download_one_stream"],
        "ratio": figures["download_cairn"] / figures["download_one_stream"],
        "unit": "s",
        "reference_name": "Cairn, max_concurrency=1",
        "note": f"{tuned} against one sequential stream per file; best of {repeat}",
    })
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    print_table(run(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
