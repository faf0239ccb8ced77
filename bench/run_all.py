"""Run the benchmarks and print one table of Cairn's figures beside Ray Train 2.60's.

    python bench/run_all.py [--quick] [--only NAME ...] [--no-ray] [--write-results]

``make bench`` runs this. Each benchmark is a module ``bench/<name>.py`` exposing
``run(args) -> list[Row | dict]`` (``args`` is this script's parsed arguments:
``quick``, ``only``, ``no_ray``, ``write_results``). A module that does not exist yet
gets a "skipped" row, and one that raises gets an error row; the others still run.

After the modules, the Ray Train reference figures of the selected benchmarks are
measured (``bench/_ray_reference.py``; cached, so a module that already asked for a
figure does not make Ray run twice) and merged: a reference figure fills the reference
column of the module row with the same benchmark and metric, and is listed on its own
otherwise. With ``--quick``, the figures that share one Ray session are measured before
the modules (:func:`prefetch_reference`). ``--only ray-reference`` measures only the
Ray side; ``--no-ray`` skips it. ``--only scale`` runs the benchmarks at scale
(:data:`SELECTIONS`).

With ``--write-results`` the table is appended, with the command and the machine, to
``docs/benchmarks.md``. The exit status is 1 when any row is an error.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
for _path in (str(REPO_ROOT), str(BENCH_DIR)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import _harness  # noqa: E402
import _ray_reference  # noqa: E402

# One module object whichever way a benchmark imports the harness
# (``import _harness`` or ``from bench import _harness``).
sys.modules.setdefault("bench._harness", _harness)
sys.modules.setdefault("bench._ray_reference", _ray_reference)

Row = _harness.Row

MODULES = ("transfer", "report", "recovery", "goodput", "snapshot", "as_directory",
           "resume_check", "small_files", "s3_transfer", "s3_resume", "local_tier",
           "torch_recovery", "train_step", "dcp", "many_ranks", "ray_cluster", "local_mode")
"""Benchmark modules, in the order they run and appear in the table."""

RAY_REFERENCE = "ray-reference"

SELECTIONS = {
    "scale": ("resume_check", "small_files", "s3_transfer", "s3_resume", "local_tier",
              "torch_recovery", "train_step", "dcp", "many_ranks"),
}
"""Names ``--only`` also takes, each for several modules: ``scale`` is the benchmarks at
scale, whose references are measured in the same run without Ray (``--quick --only
scale`` runs in under 3 minutes on 2 cores)."""

logger = logging.getLogger("bench.run_all")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    names = sorted({*MODULES, *_ray_reference.REFERENCE_GROUPS, RAY_REFERENCE, *SELECTIONS})
    parser = argparse.ArgumentParser(
        description="Run Cairn's benchmarks beside Ray Train 2.60 and print one table."
    )
    parser.add_argument(
        "--quick", action="store_true", help="smaller runs (Ray side under ~4 minutes)"
    )
    parser.add_argument(
        "--only",
        action="append",
        default=None,
        metavar="NAME",
        help=f"run only this benchmark (repeatable, or comma-separated); one of {names}",
    )
    parser.add_argument(
        "--no-ray", action="store_true", help="skip the Ray Train reference measurements"
    )
    parser.add_argument(
        "--write-results",
        action="store_true",
        help="append the table, command and machine to docs/benchmarks.md",
    )
    parser.add_argument(
        "--results-path",
        default=str(_harness.DEFAULT_RESULTS_PATH),
        help="results page for --write-results (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    if args.only:
        selected = [n.strip() for item in args.only for n in item.split(",") if n.strip()]
        unknown = sorted(set(selected) - set(names))
        if unknown:
            parser.error(f"unknown benchmark(s) {unknown} for --only; choose from {names}")
        args.only = [name for n in selected for name in SELECTIONS.get(n, (n,))]
    return args


def selected_modules(args: argparse.Namespace) -> list[str]:
    if not args.only:
        return list(MODULES)
    return [name for name in MODULES if name in args.only]


def selected_reference_groups(args: argparse.Namespace) -> list[str]:
    if args.no_ray:
        return []
    groups = _ray_reference.REFERENCE_GROUPS
    if not args.only or RAY_REFERENCE in args.only:
        return list(groups)
    return [group for group in groups if group in args.only]


def import_benchmark(name: str) -> ModuleType | None:
    """The module ``bench/<name>.py``, or None when it does not exist."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            return None
        raise


def run_module(name: str, args: argparse.Namespace) -> list[Row]:
    """The rows of one benchmark module; a skip row or an error row when it cannot run."""
    started = time.perf_counter()
    try:
        module = import_benchmark(name)
        if module is None:
            return [
                Row(
                    benchmark=name,
                    metric="skipped",
                    unit="",
                    reference_name="",
                    note=f"bench/{name}.py does not exist yet",
                )
            ]
        run = getattr(module, "run", None)
        if not callable(run):
            raise TypeError(f"bench/{name}.py has no run(args) function")
        rows = [Row.coerce(item) for item in run(args)]
    except Exception as exc:  # one failed benchmark must not lose the rest of the table
        traceback.print_exc()
        return [_harness.error_row(name, exc)]
    logger.info("%s: %d rows in %.1f s", name, len(rows), time.perf_counter() - started)
    return rows


def merge_reference(rows: list[Row], reference: list[Row]) -> list[Row]:
    """Fill module rows' reference columns from reference rows with the same key.

    A reference row whose (benchmark, metric) matches a module row without a reference
    fills it; one matching a row that already has a reference is dropped (the module
    measured it itself); any other is listed after the rows of its benchmark.
    """
    merged = list(rows)
    index = {(r.benchmark, r.metric): i for i, r in enumerate(merged)}
    extra: list[Row] = []
    for ref in reference:
        position = index.get((ref.benchmark, ref.metric))
        if position is None:
            extra.append(ref)
        elif merged[position].reference is None:
            merged[position] = merged[position].with_reference(ref)
    order: dict[str, int] = {}
    for name in [*MODULES, *_ray_reference.REFERENCE_GROUPS]:
        order.setdefault(name, len(order))
    combined = merged + extra
    # Stable: module rows keep their order, reference-only rows follow their benchmark's.
    return sorted(combined, key=lambda r: order.get(r.benchmark, len(order)))


def needed_reference_groups(args: argparse.Namespace) -> list[str]:
    """The Ray groups this run will ask for: its own, and those its modules ask for.

    A module names the groups it fills its rows from in ``RAY_REFERENCE_GROUPS``; one
    that cannot be imported is left to :func:`run_module` to report.
    """
    if args.no_ray:
        return []
    needed = set(selected_reference_groups(args))
    for name in selected_modules(args):
        try:
            module = import_benchmark(name)
        except Exception:  # run_module turns it into an error row
            continue
        needed.update(getattr(module, "RAY_REFERENCE_GROUPS", ()))
    return [group for group in _ray_reference.REFERENCE_GROUPS if group in needed]


def prefetch_reference(args: argparse.Namespace) -> None:
    """With ``--quick``, measure the Ray figures that share a session, all in one go.

    Without it, a module asking for its groups would start the shared session for those
    alone, and the next module another. The figures land in ``_ray_reference``'s cache,
    where the modules and :func:`collect_rows` then find them.
    """
    if not args.quick or _ray_reference.ray_version() is None:
        return
    groups = needed_reference_groups(args)
    if not set(groups) & set(_ray_reference.QUICK_SESSION_GROUPS):
        return
    print(f"[bench] measuring Ray Train reference (one quick session): {', '.join(groups)} ...",
          file=sys.stderr, flush=True)
    started = time.perf_counter()
    _ray_reference.prefetch(groups, quick=True)
    logger.info("Ray reference quick session: %.1f s", time.perf_counter() - started)


def collect_rows(args: argparse.Namespace) -> list[Row]:
    rows: list[Row] = []
    prefetch_reference(args)
    for name in selected_modules(args):
        print(f"[bench] running {name} ...", file=sys.stderr, flush=True)
        rows.extend(run_module(name, args))
    groups = selected_reference_groups(args)
    if groups:
        if _ray_reference.ray_version() is None:
            rows.append(
                Row(
                    benchmark="ray-reference",
                    metric="skipped",
                    unit="",
                    reference_name="",
                    note="Ray is not installed: pip install 'ray[train]==2.60.0'",
                )
            )
        else:
            print(
                f"[bench] measuring Ray Train reference: {', '.join(groups)} ...",
                file=sys.stderr,
                flush=True,
            )
            started = time.perf_counter()
            reference = _ray_reference.reference_rows(quick=args.quick, groups=groups)
            logger.info("Ray reference: %.1f s", time.perf_counter() - started)
            rows = merge_reference(rows, reference)
    return rows


def command_line(argv: Sequence[str]) -> str:
    return " ".join(["python", "bench/run_all.py", *argv])


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="[bench] %(message)s", stream=sys.stderr)
    args = parse_args(argv)
    started = time.perf_counter()
    rows = collect_rows(args)
    print(f"[bench] done in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    _harness.print_table(rows)
    if args.write_results:
        _harness.write_results(rows, args.results_path, command=command_line(argv))
        print(f"[bench] results appended to {args.results_path}", file=sys.stderr)
    return 1 if any(_harness.is_error_row(row) for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
