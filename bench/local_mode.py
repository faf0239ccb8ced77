"""Local mode (``ScalingConfig(num_workers=0)``) beside one local worker process, in one run.

Usage::

    python bench/local_mode.py [--quick] [--rounds N]

The same train function runs with ``num_workers=0`` (in the driver's process, on the
thread that called ``fit()``) and with ``num_workers=1`` (one worker process of the local
backend), alternating, ``--rounds`` fits of each (5; 3 with ``--quick``), on local storage
in a temporary directory. Figures, each the median over its fits:

1. ``fit()`` to the first line of the train function (``time.time`` in the driver before
   ``fit()`` and in the train function; both read the same clock);
2. metric-only ``report()`` blocking, 2,000 reports a fit (500 with ``--quick``): the median
   and the p99 of all samples pooled;
3. SYNC ``report()`` of a 1 KiB checkpoint, call to return (the commit included), 20
   reports a fit (10), median.

Local mode sends its reports over the same loopback connection as a worker process does,
so reports cost the same; what it saves is the start of a process (interpreter, imports,
unpickling the function). Ratio: local mode / one worker (lower is faster). ``run(args)``
returns the rows for ``bench/run_all.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
for _path in (str(BENCH_DIR.parent), str(BENCH_DIR)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from _harness import p99, print_table, quiet_logger  # noqa: E402

import cairn  # noqa: E402

REFERENCE = "1 local worker process"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer fits and reports")
    parser.add_argument("--rounds", type=int, default=None, help="fits of each (median)")
    parser.add_argument("--no-ray", action="store_true", help="accepted for run_all")
    return parser.parse_args(argv)


def train(config: dict[str, Any]) -> None:
    """Times its first line, metric-only reports and small SYNC checkpoint reports."""
    first_line = time.time()
    clock = time.perf_counter
    metric = []
    for step in range(int(config["metric_reports"])):
        started = clock()
        cairn.report({"step": step})
        metric.append(clock() - started)
    sync = []
    payload = os.urandom(1024)
    for step in range(int(config["sync_reports"])):
        with tempfile.TemporaryDirectory() as directory:
            Path(directory, "state.bin").write_bytes(payload)
            checkpoint = cairn.Checkpoint.from_directory(directory)
            started = clock()
            cairn.report({"sync": step}, checkpoint=checkpoint)
            sync.append(clock() - started)
    out = Path(config["out"])
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps({"first_line": first_line, "metric": metric, "sync": sync}))
    os.replace(tmp, out)


def one_fit(num_workers: int, scratch: str, number: int, metric_reports: int,
            sync_reports: int) -> dict[str, Any]:
    out = os.path.join(scratch, f"out_{num_workers}_{number}.json")
    trainer = cairn.Trainer(
        train,
        train_loop_config={"out": out, "metric_reports": metric_reports,
                           "sync_reports": sync_reports},
        scaling_config=cairn.ScalingConfig(num_workers=num_workers),
        run_config=cairn.RunConfig(name=f"run_{num_workers}_{number}",
                                   storage_path=os.path.join(scratch, "runs"), progress=0,
                                   checkpoint_config=cairn.CheckpointConfig(num_to_keep=2)),
    )
    started = time.time()
    trainer.fit()
    measured: dict[str, Any] = json.loads(Path(out).read_text())
    measured["startup"] = measured["first_line"] - started
    return measured


def run(args: Any = None) -> list[dict[str, Any]]:
    """Rows ``{benchmark, metric, cairn, reference, ratio, unit, ...}`` for the harness."""
    if args is None or isinstance(args, (list, tuple)):
        args = parse_args(args)
    quick = bool(getattr(args, "quick", False))
    rounds = getattr(args, "rounds", None) or (3 if quick else 5)
    metric_reports, sync_reports = (500, 10) if quick else (2000, 20)
    scratch = tempfile.mkdtemp(prefix="cairn-bench-local-mode-")
    fits: dict[int, list[dict[str, Any]]] = {0: [], 1: []}
    try:
        # In local mode Cairn's log lines come from this process; the workers' do not.
        with quiet_logger("cairn"):
            for number in range(rounds):  # alternate, so that load drifts hit both alike
                for num_workers in (0, 1) if number % 2 == 0 else (1, 0):
                    fits[num_workers].append(one_fit(num_workers, scratch, number,
                                                     metric_reports, sync_reports))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    def figures(num_workers: int) -> dict[str, float]:
        runs = fits[num_workers]
        metric = [s for r in runs for s in r["metric"]]
        return {
            "startup": statistics.median(r["startup"] for r in runs),
            "metric_median": statistics.median(metric),
            "metric_p99": p99(metric),
            "sync_median": statistics.median(s for r in runs for s in r["sync"]),
        }

    local, worker = figures(0), figures(1)
    startups = ", ".join(f"{r['startup']:.3f}" for r in fits[0])
    rows = [
        ("startup", "fit() to the first line of the train function", "s",
         f"median of {rounds} fits; local mode {startups} s"),
        ("metric_median", "metric-only report() blocking, median", "ms",
         f"{metric_reports} reports x {rounds} fits, pooled"),
        ("metric_p99", "metric-only report() blocking, p99", "ms",
         f"{metric_reports} reports x {rounds} fits, pooled"),
        ("sync_median", "SYNC report() of a 1 KiB checkpoint, call to return", "ms",
         f"{sync_reports} reports x {rounds} fits, pooled; the commit included"),
    ]
    result = []
    for key, metric, unit, note in rows:
        scale = 1000.0 if unit == "ms" else 1.0
        cairn_value, reference = local[key] * scale, worker[key] * scale
        result.append({
            "benchmark": "local_mode", "metric": f"{metric}, local mode (num_workers=0)",
            "cairn": cairn_value, "reference": reference, "unit": unit,
            "ratio": cairn_value / reference if reference else None,
            "reference_name": REFERENCE, "note": note,
        })
    return result


def main(argv: Sequence[str] | None = None) -> int:
    print_table(run(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
