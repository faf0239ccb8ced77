"""Cairn's own figures at an earlier revision beside the working tree, in one run.

    python bench/before_after.py REV [--quick] [--only NAME ...] [--rounds N]

The benchmarks of ``bench/run_all.py`` measure Cairn beside a reference (Ray Train, a raw
copy). This script answers another question: did a change make Cairn slower? It exports
``REV`` (any git revision) to a temporary directory and runs each selected benchmark module
in both trees, each in a fresh subprocess with that tree first on ``sys.path`` and Ray's
reference off (``--no-ray``; the references measured in the same run, such as a raw copy,
stay). Where a row has such a reference, its ratio to it is shown for each tree too: on a
shared machine that ratio, measured in the same process moments apart, moves less than
the figure itself. Modules alternate which tree goes first, round after round, so a load that drifts
during the run falls on both sides. It prints, per figure, the median over the rounds
before and after, and ``after / before``; a figure only one side has is shown alone.

Each tree runs its own benchmark code: a benchmark whose workload changed between the two
revisions measures two different things, and its row says so only through its metric
name. ``--only`` takes the names ``run_all.py`` takes; the default is every module the
working tree has.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

import _harness  # noqa: E402

MARKER = "@@before-after-rows@@"

# Run in the subprocess: one module of one tree's run_all, its rows as JSON on one line.
_CHILD = """
import dataclasses, json, sys
tree, name, *flags = sys.argv[1:]
sys.path[:0] = [tree, tree + "/bench"]
import run_all
args = run_all.parse_args(["--no-ray", "--only", name, *flags])
rows = run_all.run_module(name, args)
print({marker!r} + json.dumps([dataclasses.asdict(row) for row in rows]), flush=True)
"""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("rev", help="the git revision to compare with, e.g. a commit or tag")
    parser.add_argument("--quick", action="store_true", help="the benchmarks' smaller runs")
    parser.add_argument("--only", action="append", default=None, metavar="NAME",
                        help="run only this benchmark (repeatable, or comma-separated)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="runs of each module per tree (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be an integer >= 1, got {args.rounds}")
    return args


def export_revision(rev: str, into: Path) -> Path:
    """The files of ``rev`` under ``into`` (``git archive``, no checkout touched)."""
    archive = into / "rev.tar"
    with archive.open("wb") as f:
        subprocess.run(["git", "archive", "--format=tar", rev], cwd=REPO_ROOT, stdout=f,
                       check=True)
    tree = into / "tree"
    tree.mkdir()
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    archive.unlink()
    return tree


def modules(tree: Path) -> list[str]:
    """The benchmark modules a tree's ``run_all.py`` lists."""
    out = subprocess.run(
        [sys.executable, "-c",
         f"import sys; sys.path[:0] = [{str(tree)!r}, {str(tree / 'bench')!r}]; "
         "import run_all; print(' '.join(run_all.MODULES))"],
        cwd=tree, capture_output=True, text=True, check=True,
    )
    return out.stdout.split()


def run_one(tree: Path, name: str, quick: bool) -> list[dict[str, object]]:
    """The rows of one module in one tree; an error row when it fails."""
    flags = ["--quick"] if quick else []
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD.format(marker=MARKER), str(tree), name, *flags],
        cwd=tree, env=env, capture_output=True, text=True,
    )
    for line in proc.stdout.splitlines():
        if line.startswith(MARKER):
            rows: list[dict[str, object]] = json.loads(line[len(MARKER):])
            return rows
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
    return [{"benchmark": name, "metric": "error", "cairn": None, "unit": "",
             "note": f"exit {proc.returncode}: {tail[0]}"}]


def compare(rev: str, names: Sequence[str] | None, quick: bool, rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="cairn-before-") as tmp:
        before = export_revision(rev, Path(tmp))
        after = REPO_ROOT
        here, there = modules(after), set(modules(before))
        selected = [n for n in here if not names or n in names]
        samples: dict[tuple[str, str], dict[str, list[float]]] = {}
        ratios: dict[tuple[str, str], dict[str, list[float]]] = {}
        units: dict[tuple[str, str], str] = {}
        started = time.perf_counter()
        for index, name in enumerate(selected):
            for round_ in range(rounds):
                sides = [("before", before), ("after", after)]
                if (index + round_) % 2:
                    sides.reverse()
                for side, tree in sides:
                    if side == "before" and name not in there:
                        continue
                    print(f"# {name}, round {round_ + 1}, {side}", file=sys.stderr, flush=True)
                    for row in run_one(tree, name, quick):
                        key = (str(row["benchmark"]), str(row["metric"]))
                        units[key] = str(row.get("unit", ""))
                        value = row.get("cairn")
                        slot = samples.setdefault(key, {"before": [], "after": []})
                        if isinstance(value, (int, float)):
                            slot[side].append(float(value))
                        reference = row.get("reference")
                        if isinstance(value, (int, float)) and isinstance(
                                reference, (int, float)) and reference > 0:
                            ratios.setdefault(key, {"before": [], "after": []})[side].append(
                                float(value) / float(reference))
        print(f"Cairn at {rev} (before) and the working tree (after), "
              f"{'--quick, ' if quick else ''}{rounds} round(s), "
              f"{time.perf_counter() - started:.0f} s")
        print(f"Machine: {_harness.format_machine(_harness.machine_info())}")
        print()
        print("| benchmark | metric | before | after | after / before "
              "| to its reference, before | after |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for key, slot in samples.items():
            b, a = _median(slot["before"]), _median(slot["after"])
            ratio = a / b if a is not None and b else None
            to_ref = ratios.get(key, {"before": [], "after": []})
            print(f"| {key[0]} | {key[1]} ({units[key]}) | {_harness.format_value(b)} | "
                  f"{_harness.format_value(a)} | {_harness.format_ratio(ratio)} | "
                  f"{_harness.format_ratio(_median(to_ref['before']))} | "
                  f"{_harness.format_ratio(_median(to_ref['after']))} |")


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    names = None
    if args.only:
        import run_all  # the selection names ("scale") of this tree's run_all

        asked = [n.strip() for item in args.only for n in item.split(",") if n.strip()]
        names = [name for n in asked for name in run_all.SELECTIONS.get(n, (n,))]
    compare(args.rev, names, args.quick, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
