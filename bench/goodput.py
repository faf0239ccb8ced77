"""Goodput of the shared goodput job (``_goodput_job.GoodputJob``), Cairn beside Ray Train.

Usage::

    python bench/goodput.py [--quick] [--no-ray]

Both sides run the identical job through ``goodput_train_loop`` (60 s of useful 0.25 s
steps, a checkpoint every 5 s, rank 1 killed with ``os._exit(1)`` at 22.5 s and 47.5 s of
progress; ``--quick``: 8 s, every 2 s, one crash at 5 s), with
``FailureConfig(max_failures=<crashes + 1>)``. Goodput is the harness's pure definition:
distinct steps executed times the step length, over the wall time of ``fit()`` (call to
return); a step executed again after a rollback counts once.

Checkpoints are SYNC, the default on both sides: the job's 4 MiB checkpoint is committed
in milliseconds, so ASYNC could win at most that per checkpoint, and the shared loop
deletes its checkpoint directory as soon as ``report()`` returns, which only a SYNC
report allows. The same job thus runs unchanged on both libraries.

Cairn's own account of the run, ``Result.goodput`` (from its event log: start-up,
checkpoint stalls, recovery, lost work), is printed and given as a row of its own.
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
for _path in (str(BENCH_DIR.parent), str(BENCH_DIR)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import _harness  # noqa: E402
import _module  # noqa: E402
import _ray_reference as ray_ref  # noqa: E402

import cairn  # noqa: E402

Row = _harness.Row

RAY_REFERENCE_GROUPS = ("goodput",)
"""The Ray reference groups this module fills its rows from (``run_all`` prefetches them)."""

logger = logging.getLogger("bench.goodput")


def measure(job: _harness.GoodputJob, work: Path) -> tuple[dict[str, Any], cairn.GoodputSummary]:
    """Run ``job`` with Cairn; the harness's summary and Cairn's ``Result.goodput``."""
    trainer = cairn.Trainer(
        _harness.goodput_train_loop,
        train_loop_config={"job": job.to_config(), "api": "cairn", "work_dir": str(work)},
        scaling_config=cairn.ScalingConfig(num_workers=job.num_workers),
        run_config=cairn.RunConfig(
            name="goodput",
            storage_path=str(work / "storage"),
            # One spare, so that an unexpected extra failure shows in ``attempts``
            # instead of failing the run (as on the Ray side).
            failure_config=cairn.FailureConfig(max_failures=len(job.crash_steps) + 1),
        ),
    )
    started = time.perf_counter()
    result = trainer.fit()
    wall_s = time.perf_counter() - started
    steps, attempts = _harness.read_goodput_log(work, rank=0)
    summary = job.summarize(wall_s, steps)
    summary["attempts"] = attempts
    return summary, result.goodput


def cairn_rows(args: Any) -> list[Row]:
    quick = bool(getattr(args, "quick", False))
    job = _harness.goodput_job(quick)
    logger.info("goodput job (%s): %g s of useful steps", "quick" if quick else "full",
                job.useful_s)
    with _harness.quiet_logger("cairn"), tempfile.TemporaryDirectory(
        prefix="cairn-bench-goodput-"
    ) as tmp:
        summary, own = measure(job, Path(tmp))
    print(f"Cairn's Result.goodput for the goodput job:\n{own.format()}", file=sys.stderr)
    if not summary["completed"]:
        raise RuntimeError(f"the goodput job did not complete: {summary}")
    detail = (
        f"{'quick' if quick else 'full'} GoodputJob: {job.useful_s:g} s useful, "
        f"ckpt every {job.checkpoint_every_s:g} s (SYNC), crashes at {list(job.crash_at)} s; "
        f"{summary['attempts']} attempts, {summary['redone_s']:.2f} s redone"
    )
    return [
        Row(benchmark="goodput", metric=ray_ref.METRIC_GOODPUT, cairn=summary["goodput"],
            unit="fraction", note=f"higher is better; {detail}"),
        Row(benchmark="goodput", metric=ray_ref.METRIC_GOODPUT_WALL, cairn=summary["wall_s"],
            note="fit() call to return"),
        Row(benchmark="goodput", metric="goodput by Cairn's own account (Result.goodput)",
            cairn=own.goodput, unit="fraction", reference_name="",
            note=f"wall {own.wall_s:.1f} s: start-up {own.startup_s:.2f} s, checkpoint stall "
                 f"{own.checkpoint_blocked_s:.2f} s, recovery {own.recovery_s:.2f} s, lost work "
                 f"{own.lost_work_s:.2f} s; {own.attempts} attempts, {own.failures} failures"),
    ]


def run(args: Any = None) -> list[Row]:
    """Cairn's rows, with Ray Train 2.60's figures as references unless ``args.no_ray``."""
    args = args if args is not None else _module.parse_args(__doc__)
    return _module.with_references(cairn_rows(args), args, RAY_REFERENCE_GROUPS)


def main(argv: list[str] | None = None) -> int:
    return _module.module_main(__doc__, run, argv)


if __name__ == "__main__":
    sys.exit(main())
