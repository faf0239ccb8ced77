"""Shared pieces of the benchmarks: result rows, the table, machine facts, timing.

Every benchmark module under ``bench/`` returns a list of :class:`Row` (or dicts with
the same keys); ``bench/run_all.py`` prints them as one table and, with
``--write-results``, appends a dated section to ``docs/benchmarks.md`` through
:func:`write_results`.

:class:`GoodputJob` (the goodput job both libraries run) and its training function
:func:`goodput_train_loop` live in ``bench/_goodput_job.py`` and are re-exported here.

:func:`fill_references` puts reference figures into a benchmark's own rows (the same
matching rule as ``run_all``), and :func:`parse_module_args` gives each benchmark module
the command line it accepts when run on its own (``--quick``, ``--no-ray``).

This module imports nothing beyond the standard library at import time, so worker
processes of either library can import it cheaply.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _datetime
import importlib
import importlib.metadata
import json
import logging
import math
import numbers
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

# The goodput job and the checkpoint data live in their own modules; their names are
# re-exported here.
try:
    import _checkpoint_data
    import _goodput_job
except ImportError:  # imported as bench._harness with only the repo root on the path
    from bench import (
        _checkpoint_data,  # type: ignore[no-redef]
        _goodput_job,  # type: ignore[no-redef]
    )

make_checkpoint_dir = _checkpoint_data.make_checkpoint_dir

GoodputJob = _goodput_job.GoodputJob
GOODPUT_JOB = _goodput_job.GOODPUT_JOB
GOODPUT_JOB_QUICK = _goodput_job.GOODPUT_JOB_QUICK
goodput_job = _goodput_job.goodput_job
goodput_steps_log = _goodput_job.goodput_steps_log
goodput_train_loop = _goodput_job.goodput_train_loop
read_goodput_log = _goodput_job.read_goodput_log

REPO_ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = REPO_ROOT / "bench"
DEFAULT_RESULTS_PATH = REPO_ROOT / "docs" / "benchmarks.md"

RAY_REFERENCE_NAME = "Ray Train 2.60"

# --------------------------------------------------------------------------------------
# Rows and the table
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class Row:
    """One figure of one benchmark, Cairn's value beside its reference.

    ``ratio`` is ``cairn / reference``, or ``None`` when either value is missing or the
    reference is zero. Whether lower is better depends on the metric (seconds: lower;
    goodput: higher); the ``note`` says so when it is not seconds.
    """

    benchmark: str
    metric: str
    cairn: float | None = None
    reference: float | None = None
    reference_name: str = RAY_REFERENCE_NAME
    unit: str = "s"
    note: str = ""

    def __post_init__(self) -> None:
        for field in ("cairn", "reference"):
            value = getattr(self, field)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(
                    f"Row.{field} must be a number or None, got {value!r} "
                    f"({type(value).__name__}) for {self.benchmark}/{self.metric}"
                )
            object.__setattr__(self, field, float(value))

    @property
    def ratio(self) -> float | None:
        if self.cairn is None or self.reference is None or self.reference == 0:
            return None
        return float(self.cairn) / float(self.reference)

    @classmethod
    def coerce(cls, item: Row | Mapping[str, Any] | Any) -> Row:
        """A Row from a Row, a dict with Row's keys, or a Row of another import of this module.

        A ``ratio`` key is ignored (it is always computed); an unknown key is an error.
        """
        if isinstance(item, Row):
            return item
        if isinstance(item, Mapping):
            data = dict(item)
        elif dataclasses.is_dataclass(item) and not isinstance(item, type):
            # The same class imported twice (``_harness`` and ``bench._harness``).
            data = {f.name: getattr(item, f.name) for f in dataclasses.fields(item)}
        else:
            raise TypeError(
                f"a benchmark row must be a Row or a dict, got {type(item).__name__}: {item!r}"
            )
        data.pop("ratio", None)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise TypeError(
                f"unknown row key(s) {unknown} in {data!r}; accepted keys: {sorted(known)}"
            )
        return cls(**data)

    def with_reference(self, other: Row) -> Row:
        """This row with the reference value, name and note of ``other`` filled in."""
        note = self.note
        if other.note and other.note not in note:
            note = f"{note}; ref: {other.note}" if note else f"ref: {other.note}"
        return dataclasses.replace(
            self, reference=other.reference, reference_name=other.reference_name, note=note
        )


def format_value(value: float | None) -> str:
    """Three significant figures, without exponents for the sizes benchmarks produce."""
    if value is None:
        return "-"
    if math.isnan(value):
        return "nan"
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def format_ratio(ratio: float | None) -> str:
    if ratio is None:
        return "-"
    if ratio >= 100:
        return f"{ratio:,.0f}x"
    return f"{ratio:.3g}x"


TABLE_HEADER = ("Benchmark", "Metric", "Cairn", "Reference", "Against", "Unit", "Cairn/Ref", "Note")


def table_cells(row: Row) -> tuple[str, ...]:
    return (
        row.benchmark,
        row.metric,
        format_value(row.cairn),
        format_value(row.reference),
        row.reference_name if row.reference is not None else "-",
        row.unit,
        format_ratio(row.ratio),
        row.note.replace("|", "/").replace("\n", " "),
    )


def format_table(rows: Iterable[Row | Mapping[str, Any]]) -> str:
    """A Markdown table of the rows, padded so it also reads well in a terminal."""
    body = [table_cells(Row.coerce(row)) for row in rows]
    widths = [len(h) for h in TABLE_HEADER]
    for cells in body:
        widths = [max(w, len(c)) for w, c in zip(widths, cells, strict=True)]
    numeric = {2, 3, 6}

    def line(cells: Sequence[str]) -> str:
        padded = [
            c.rjust(w) if i in numeric else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "| " + " | ".join(padded) + " |"

    rule = (
        "|"
        + "|".join(
            ("-" * (w + 1) + ":") if i in numeric else ("-" * (w + 2)) for i, w in enumerate(widths)
        )
        + "|"
    )
    return "\n".join([line(TABLE_HEADER), rule, *(line(cells) for cells in body)])


def print_table(rows: Iterable[Row | Mapping[str, Any]], file: IO[str] | None = None) -> None:
    print(format_table(rows), file=file if file is not None else sys.stdout)


def error_row(benchmark: str, exc: BaseException, metric: str = "error") -> Row:
    """The row printed in place of a benchmark that raised: the exception's first line."""
    message = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return Row(benchmark=benchmark, metric=metric, unit="", reference_name="", note=message)


def is_error_row(row: Row) -> bool:
    return row.metric == "error" or row.metric.endswith(" error")


def fill_references(
    rows: Iterable[Row | Mapping[str, Any]], reference: Iterable[Row | Mapping[str, Any]]
) -> list[Row]:
    """``rows`` with reference columns filled from ``reference`` rows of the same key.

    A reference row whose ``(benchmark, metric)`` matches a row without a reference fills
    it (``run_all``'s rule); the reference rows that match nothing are appended, so a
    benchmark run on its own prints every figure it asked for. ``run_all`` drops them again
    when it merges, because the matching rows then already have a reference.
    """
    filled = [Row.coerce(row) for row in rows]
    index = {(row.benchmark, row.metric): i for i, row in enumerate(filled)}
    extra: list[Row] = []
    for item in reference:
        ref = Row.coerce(item)
        position = index.get((ref.benchmark, ref.metric))
        if position is None:
            index[(ref.benchmark, ref.metric)] = len(filled) + len(extra)
            extra.append(ref)
        elif filled[position].reference is None:
            filled[position] = filled[position].with_reference(ref)
    return filled + extra


def parse_module_args(description: str, argv: Sequence[str] | None = None) -> Any:
    """The command line of a benchmark module run on its own.

    The namespace has the attributes ``run_all`` passes to ``run(args)``: ``quick``,
    ``no_ray``, ``only`` (None) and ``write_results`` (False).
    """
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="smaller runs")
    parser.add_argument(
        "--no-ray", action="store_true", help="skip the Ray Train reference measurements"
    )
    args = parser.parse_args(argv)
    args.only = None
    args.write_results = False
    return args


@contextlib.contextmanager
def quiet_logger(name: str, level: int = logging.WARNING) -> Iterator[None]:
    """Raise logger ``name``'s level while a benchmark runs, then restore it.

    ``run_all`` logs at INFO; a library's per-commit INFO lines on the driver's console
    would be part of what is timed (1,000 commits, 1,000 lines).
    """
    logger = logging.getLogger(name)
    previous = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(previous)


# --------------------------------------------------------------------------------------
# Machine facts and the results page
# --------------------------------------------------------------------------------------


def package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return None


def _usable_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def source_revision() -> str:
    """The git commit of the tree being measured, ``+dirty`` when it has local changes."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}+dirty" if dirty else head


def machine_info() -> dict[str, Any]:
    """Facts about the machine and the software versions a result depends on."""
    memory = _memory_gib()
    return {
        "date": _datetime.datetime.now(_datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cores": _usable_cores(),
        "memory_gib": round(memory, 1) if memory is not None else None,
        "cpu": _cpu_model(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "pyarrow": package_version("pyarrow"),
        "torch": package_version("torch"),
        "ray": package_version("ray"),
        "cairn": package_version("cairn"),
    }


def format_machine(info: Mapping[str, Any]) -> str:
    memory = info.get("memory_gib")
    memory_text = f"{memory} GiB" if memory is not None else "unknown memory"
    return (
        f"{info.get('cores')} cores ({info.get('cpu')}), {memory_text}, {info.get('os')}; "
        f"Python {info.get('python')}, pyarrow {info.get('pyarrow')}, "
        f"torch {info.get('torch')}, ray {info.get('ray')}, cairn {info.get('cairn')}"
    )


RESULTS_PAGE_HEADER = """\
# Benchmark results

Cairn against its references, mostly Ray Train 2.60 doing the same thing on the same
machine. Each section below was appended by

    python bench/run_all.py --write-results

(`make bench` runs the same script). A section records the command, the machine and the
table it printed; sections are never edited afterwards, so the page is a log, newest last.
What each benchmark measures, and how the reference side is run, is in
[bench/README.md](../bench/README.md); the targets are in the design's
"Performance targets".

Columns: **Cairn** and **Reference** are the two measured figures in **Unit**;
**Cairn/Ref** is their ratio (below 1x means Cairn is faster for times, and worse for
goodput); a `-` means that side was not measured in that run.
"""


def write_results(
    rows: Iterable[Row | Mapping[str, Any]],
    path: str | os.PathLike[str] = DEFAULT_RESULTS_PATH,
    *,
    command: str | None = None,
    machine: Mapping[str, Any] | None = None,
    title: str | None = None,
) -> str:
    """Append a dated section (command, machine, table) to the results page; return it.

    The page is created with its header when it does not exist. Existing text is never
    rewritten: the section is appended.
    """
    info = dict(machine) if machine is not None else machine_info()
    if command is None:
        command = "python " + " ".join([_relative_script(sys.argv[0]), *sys.argv[1:]])
    heading = f"## {info.get('date')}" + (f": {title}" if title else "")
    section = "\n".join(
        [
            heading,
            "",
            f"Command: `{command}`",
            "",
            f"Machine: {format_machine(info)}",
            "",
            f"Source: {source_revision()}",
            "",
            format_table(rows),
            "",
        ]
    )
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    existing = target.read_text(encoding="utf-8") if target.exists() else ""
    if not existing.strip():
        target.write_text(RESULTS_PAGE_HEADER + "\n" + section, encoding="utf-8")
        return section
    if existing.endswith("\n\n"):
        separator = ""
    elif existing.endswith("\n"):
        separator = "\n"
    else:
        separator = "\n\n"
    with open(target, "a", encoding="utf-8") as f:
        f.write(separator + section)
    return section


def _relative_script(script: str) -> str:
    try:
        return str(Path(script).resolve().relative_to(REPO_ROOT))
    except ValueError:
        return script


# --------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------


def percentile(samples: Sequence[float], pct: float) -> float:
    """The ``pct``-th percentile (0-100) with linear interpolation between order statistics."""
    if not samples:
        raise ValueError("percentile() needs at least one sample, got an empty sequence")
    if not 0 <= pct <= 100:
        raise ValueError(f"pct must be between 0 and 100, got {pct!r}")
    ordered = sorted(samples)
    position = (len(ordered) - 1) * pct / 100
    low = math.floor(position)
    high = math.ceil(position)
    if low == high:
        return float(ordered[low])
    return float(ordered[low] + (ordered[high] - ordered[low]) * (position - low))


def median(samples: Sequence[float]) -> float:
    return percentile(samples, 50)


def p99(samples: Sequence[float]) -> float:
    return percentile(samples, 99)


def summarize(samples: Sequence[float]) -> dict[str, float]:
    """count, median, p99, mean, min and max of the samples."""
    if not samples:
        raise ValueError("summarize() needs at least one sample, got an empty sequence")
    return {
        "count": float(len(samples)),
        "median": median(samples),
        "p99": p99(samples),
        "mean": sum(samples) / len(samples),
        "min": float(min(samples)),
        "max": float(max(samples)),
    }


class Stopwatch:
    """``with Stopwatch() as sw: ...`` then ``sw.seconds`` (monotonic, perf_counter)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._start = 0.0

    def __enter__(self) -> Stopwatch:
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.seconds = time.perf_counter() - self._start


def read_run_events(run_path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """A Cairn run's goodput event log (``<run>/events/segment_*.jsonl``), oldest first.

    Read from the files, by the documented run layout, so that benchmarks can break a
    figure down (crash, failure noticed, workers ready, ...) without private imports.
    """
    events: list[dict[str, Any]] = []
    for segment in sorted(Path(run_path, "events").glob("segment_*.jsonl")):
        for line in segment.read_text(encoding="utf-8").splitlines():
            if line.strip():
                events.append(json.loads(line))
    return sorted(events, key=lambda e: float(e.get("t", 0.0)))


# --------------------------------------------------------------------------------------
# Checkpoint payloads
# --------------------------------------------------------------------------------------


