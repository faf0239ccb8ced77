"""Bytes read from S3 while a run resumes, and crash to first step, for a checkpoint on S3.

Usage::

    python bench/s3_resume.py [--size-mib 1024] [--files 4]

Starts a moto S3 server on 127.0.0.1 (its own process) behind a proxy that counts the
bytes the server sends back (``_counting_proxy.py``), then runs ``fit()`` with one worker
and its storage on that server. The first attempt writes ``--files`` random files
totalling ``--size-mib`` MiB, reports them (SYNC), writes the wall time and calls
``os._exit(1)``; the next restores the checkpoint (``get_checkpoint().as_directory()``,
which verifies every byte as it downloads) and writes the wall time before its first
step. Three runs: a worker crash (the restarted attempt resumes from the checkpoint its
own driver committed), and a driver rerun (the first ``fit()`` has no restart left; a
second ``fit()`` of the same run resumes) with ``verify_on_resume="sizes"`` and
``"full"``. Figures:

* bytes the server sent during the resuming ``fit()``, divided by the checkpoint's size
  (what the driver's resume check and the worker's restore read, plus every small read of
  the run: index, manifest, lease, logs; target at most 1.05x with the default
  ``"sizes"``);
* crash (or the second ``fit()``'s start) to the first step after restore, against its
  reference from the same run: a raw ``pyarrow`` download of the same files from the same
  server plus the time up to the restarted train function (failure noticed, worker group
  restarted), so that the ratio shows what the restore costs beyond a raw download.

``run(args)`` returns the rows for ``bench/run_all.py`` (``quick``: 128 MiB).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

import pyarrow.fs as pafs  # noqa: E402
from _counting_proxy import read_count  # noqa: E402
from _harness import make_checkpoint_dir, print_table  # noqa: E402
from s3_transfer import BUCKET, arrow_s3, moto_server  # noqa: E402

import cairn  # noqa: E402

MODES = ("sizes", "full")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=float, default=1024.0, help="checkpoint size (MiB)")
    parser.add_argument("--files", type=int, default=4, help="number of files")
    parser.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    return parser.parse_args(argv)


@contextmanager
def counting_proxy(target: str) -> Iterator[tuple[str, int]]:
    """(``host:port`` of a counting proxy in front of ``target``, its control port)."""
    proxy = subprocess.Popen(
        [sys.executable, str(BENCH_DIR / "_counting_proxy.py"), target.rsplit(":", 1)[1]],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert proxy.stdout is not None
        port, control = (int(part) for part in proxy.stdout.readline().split())
        yield f"127.0.0.1:{port}", control
    finally:
        proxy.terminate()
        proxy.wait(timeout=30)


def _write_json(path: str, data: Any) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def _train(config: dict[str, Any]) -> None:
    entered = time.time()
    checkpoint = cairn.get_checkpoint()
    if checkpoint is None:
        src = os.path.join(config["scratch"], "attempt1")
        make_checkpoint_dir(src, config["size_mib"], config["files"])
        cairn.report({"step": 1}, checkpoint=cairn.Checkpoint.from_directory(src))
        _write_json(config["crash_file"], {"t": time.time()})
        os._exit(1)
    with checkpoint.as_directory() as restored:
        size = sum(os.path.getsize(os.path.join(restored, name))
                   for name in os.listdir(restored))
    _write_json(config["first_step_file"], {"t": time.time(), "entered": entered,
                                            "bytes": size})


def _fit(storage: str, config: dict[str, Any], mode: str, max_failures: int) -> Any:
    trainer = cairn.Trainer(
        _train, train_loop_config=config,
        scaling_config=cairn.ScalingConfig(num_workers=1),
        run_config=cairn.RunConfig(
            name="resume", storage_path=storage,
            failure_config=cairn.FailureConfig(max_failures=max_failures),
            checkpoint_config=cairn.CheckpointConfig(verify_on_resume=mode),  # type: ignore[arg-type]
            progress=0),
    )
    return trainer.fit()


def _resume(endpoint: str, control: int, mode: str, size_mib: float, files: int,
            scratch: str, driver_rerun: bool) -> dict[str, float]:
    """One run whose worker crashes after its first checkpoint. With ``driver_rerun`` the
    first fit() has no restart left and fails; a second fit() of the same run (a new
    driver, which did not commit the checkpoint itself) resumes. Bytes are counted from
    the crash's fit() start (worker crash) or the second fit()'s start (driver rerun)."""
    key = f"{mode}-{'driver' if driver_rerun else 'worker'}"
    work = os.path.join(scratch, key)
    os.makedirs(work)
    storage = (f"s3://{BUCKET}/runs-{key}?endpoint_override={endpoint}&scheme=http"
               "&region=us-east-1")
    config = {"scratch": work, "size_mib": size_mib, "files": files,
              "crash_file": os.path.join(work, "crash.json"),
              "first_step_file": os.path.join(work, "first_step.json")}
    if driver_rerun:
        try:
            _fit(storage, config, mode, max_failures=0)
        except cairn.TrainingFailedError:
            pass
    before = read_count(control)
    started = time.time()
    result = _fit(storage, config, mode, max_failures=0 if driver_rerun else 1)
    read = read_count(control) - before
    with open(config["crash_file"], encoding="utf-8") as f:
        crash = json.load(f)["t"]
    with open(config["first_step_file"], encoding="utf-8") as f:
        first = json.load(f)
    del result
    begin = started if driver_rerun else crash
    return {"read": float(read), "bytes": float(first["bytes"]),
            "to_first_step": first["t"] - begin,
            # Failure noticed, group restarted, worker started: up to its train function.
            "worker_start": first["entered"] - begin,
            "restore": first["t"] - first["entered"]}


def _raw_download(endpoint: str, scratch: str) -> float:
    """A raw pyarrow download of the 'sizes' run's checkpoint files (best of 2)."""
    s3 = arrow_s3(endpoint)
    listing = s3.get_file_info(pafs.FileSelector(f"{BUCKET}/runs-sizes-worker/resume",
                                                 recursive=True))
    data = [info.path for info in listing
            if info.type == pafs.FileType.File and "/checkpoint_" in info.path
            and not info.path.endswith(".json")]
    times = []
    for _ in range(2):
        out = os.path.join(scratch, "raw")
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        started = time.perf_counter()
        for path in data:
            with s3.open_input_stream(path) as source, \
                    open(os.path.join(out, os.path.basename(path)), "wb") as sink:
                while chunk := source.read(8 << 20):
                    sink.write(chunk)
        times.append(time.perf_counter() - started)
    return min(times)


def measure(size_mib: float, files: int, scratch: str) -> dict[str, Any]:
    with moto_server() as moto, counting_proxy(moto) as (endpoint, control):
        figures: dict[str, Any] = {
            "worker": _resume(endpoint, control, "sizes", size_mib, files, scratch, False)}
        for mode in MODES:
            figures[mode] = _resume(endpoint, control, mode, size_mib, files, scratch, True)
        figures["raw_download"] = _raw_download(moto, scratch)
    return figures


def run(args: Any = None) -> list[dict[str, Any]]:
    """Rows ``{benchmark, metric, cairn, reference, ratio, unit, ...}`` for the harness."""
    if args is None or isinstance(args, (list, tuple)):
        args = parse_args(args)
    quick = bool(getattr(args, "quick", False))
    size_mib = float(getattr(args, "size_mib", 128.0 if quick else 1024.0))
    files = int(getattr(args, "files", 4))
    scratch = tempfile.mkdtemp(prefix="cairn-bench-s3-resume-", dir=getattr(args, "dir", None))
    try:
        figures = measure(size_mib, files, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    size = f"{size_mib:g} MiB checkpoint on S3 ({files} files)"
    rows: list[dict[str, Any]] = []
    cases = [("worker", "a worker crash (the driver committed it)")] + [
        (mode, f"a driver rerun, verify_on_resume={mode!r}") for mode in MODES]
    for key, what in cases:
        got = figures[key]
        rows.append({
            "benchmark": "s3_resume", "unit": "bytes",
            "metric": f"bytes read from storage, resume after {what}, {size}",
            "cairn": got["read"], "reference": got["bytes"],
            "ratio": got["read"] / got["bytes"], "reference_name": "checkpoint size",
            "note": "counted by a proxy in front of moto: object bytes plus response "
                    "headers, everything the fit() read (index, manifest, lease, logs too)",
        })
    for key, what in cases[:2]:
        got = figures[key]
        reference = figures["raw_download"] + got["worker_start"]
        start = "crash" if key == "worker" else "fit() start"
        rows.append({
            "benchmark": "s3_resume", "unit": "s",
            "metric": f"{start} to first step after restore, {what}, {size}",
            "cairn": got["to_first_step"], "reference": reference,
            "ratio": got["to_first_step"] / reference,
            "reference_name": "raw download + worker start",
            "note": f"raw pyarrow download {figures['raw_download']:.2f} s (best of 2) + "
                    f"{start} to the train function {got['worker_start']:.2f} s; Cairn's "
                    f"restore (get_checkpoint().as_directory()) {got['restore']:.2f} s; "
                    "one run",
        })
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    print_table(run(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
