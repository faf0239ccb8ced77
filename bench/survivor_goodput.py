"""Goodput of a 60 s job with 3 single-rank crashes: survivors kept against the whole-group
restart, in one run.

Usage::

    python bench/survivor_goodput.py [--quick] [--checkpoint-every-s S] [--async-upload]

The shared goodput job (``_goodput_job.GoodputJob``, the loop of ``bench/goodput.py``: 2
workers, 0.25 s steps of sleep, every rank reports at each checkpoint step, rank 0 with a
4 MiB checkpoint directory, SYNC) with a ``cairn.collective.barrier()`` ending each step
(as a data-parallel step's all-reduce: a kept rank is stopped there, not only at its next
report), a checkpoint every second and rank 1 killed
(``os._exit(1)``) three times, at 15.5, 30.5 and 45.5 s of progress (``--quick``: 12 s,
at 3.5, 6.5 and 9.5 s). It runs three times, one after the other, with:

* ``FailureConfig(max_failures=4)``: Cairn's defaults, the whole group restarted (the
  reference);
* the same with ``warm_standby=True``;
* ``keep_survivors=True, warm_standby=True``: rank 0 keeps its process (its train function
  is stopped at its next ``report()`` and called again), only rank 1 is replaced.

Goodput is the harness's definition (``bench/goodput.py``): distinct steps executed times
the step length over the wall time of ``fit()``; Cairn's own account (``Result.goodput``:
start-up, recovery, lost work) is printed beside it. Target (issue 29): keeping survivors
gives a higher goodput than the restart, and at least 0.95.

``--checkpoint-every-s`` changes the cadence (the crashes stay where they are; a cadence
that puts a checkpoint right before a crash loses less work), and ``--async-upload``
makes rank 0's checkpoints ASYNC: the step goes on while the 4 MiB upload and commit run
in the background, which is what makes a checkpoint every step affordable.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
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

import _harness  # noqa: E402

import cairn  # noqa: E402

Row = _harness.Row

JOB = _harness.GoodputJob(duration_s=60.0, step_s=0.25, checkpoint_every_s=1.0,
                          crash_at=(15.5, 30.5, 45.5), checkpoint_mib=4.0, step_barrier=True)
QUICK_JOB = _harness.GoodputJob(duration_s=12.0, step_s=0.25, checkpoint_every_s=1.0,
                                crash_at=(3.5, 6.5, 9.5), checkpoint_mib=4.0,
                                step_barrier=True)
SIDES = {
    "restart": {},
    "restart, warm standby": {"warm_standby": True},
    "keep_survivors, warm standby": {"keep_survivors": True, "warm_standby": True},
}
TARGET = 0.95


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a 12 s job instead of 60 s")
    parser.add_argument("--checkpoint-every-s", type=float, default=None, metavar="S",
                        help="seconds of progress between checkpoints (default: 1)")
    parser.add_argument("--async-upload", action="store_true",
                        help="rank 0's checkpoints upload ASYNC instead of SYNC")
    return parser.parse_args(argv)


def job_of(args: Any) -> _harness.GoodputJob:
    """The job ``args`` ask for: the full or quick job, at their cadence and upload mode."""
    job = QUICK_JOB if getattr(args, "quick", False) else JOB
    every = getattr(args, "checkpoint_every_s", None)
    return dataclasses.replace(
        job, checkpoint_every_s=job.checkpoint_every_s if every is None else every,
        async_upload=bool(getattr(args, "async_upload", False)))


def measure(job: _harness.GoodputJob, work: Path, failure: dict[str, Any],
            ) -> tuple[dict[str, Any], cairn.GoodputSummary]:
    """Run ``job`` with ``FailureConfig(**failure)``; the harness's summary and Cairn's own."""
    trainer = cairn.Trainer(
        _harness.goodput_train_loop,
        train_loop_config={"job": job.to_config(), "api": "cairn", "work_dir": str(work)},
        scaling_config=cairn.ScalingConfig(num_workers=job.num_workers),
        run_config=cairn.RunConfig(
            name="goodput", storage_path=str(work / "storage"),
            failure_config=cairn.FailureConfig(max_failures=len(job.crash_steps) + 1,
                                               **failure)),
    )
    started = time.perf_counter()
    result = trainer.fit()
    wall_s = time.perf_counter() - started
    steps, attempts = _harness.read_goodput_log(work, rank=0)
    summary = job.summarize(wall_s, steps)
    summary["attempts"] = attempts
    if result.error is not None or not summary["completed"]:
        raise RuntimeError(f"the goodput job did not complete: {result.error!r} {summary}")
    return summary, result.goodput


def run(args: Any = None) -> list[Row]:
    args = args if args is not None else parse_args([])
    job = job_of(args)
    figures: dict[str, tuple[dict[str, Any], cairn.GoodputSummary]] = {}
    with _harness.quiet_logger("cairn"):
        for side, failure in SIDES.items():
            with tempfile.TemporaryDirectory(prefix="cairn-bench-survivor-goodput-") as tmp:
                figures[side] = measure(job, Path(tmp), failure)
    reference = figures["restart"][0]["goodput"]
    rows = []
    for side, (summary, own) in figures.items():
        mode = "ASYNC" if job.async_upload else "SYNC"
        note = (f"{job.useful_s:g} s useful, ckpt every {job.checkpoint_every_s:g} s ({mode}), "
                f"rank 1 killed at {list(job.crash_at)} s; wall {summary['wall_s']:.1f} s, "
                f"{summary['redone_s']:.2f} s redone, {summary['attempts']} attempts; Cairn's "
                f"account: start-up {own.startup_s:.2f} s, recovery {own.recovery_s:.2f} s, "
                f"lost work {own.lost_work_s:.2f} s")
        if side != "restart":
            verdict = ("met" if summary["goodput"] >= TARGET and summary["goodput"] > reference
                       else "MISSED")
            note = f"target >= {TARGET:g} and above the restart: {verdict}; {note}"
        rows.append(Row(benchmark="survivor_goodput", metric=f"goodput, {side}",
                        cairn=summary["goodput"],
                        reference=None if side == "restart" else reference,
                        reference_name="" if side == "restart" else "restart, same run",
                        unit="fraction", note=f"higher is better; {note}"))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="[bench] %(message)s", stream=sys.stderr)
    rows = run(parse_args(argv))
    _harness.print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
