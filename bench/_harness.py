"""Shared pieces of the benchmarks: result rows, the table, machine facts, timing.

Every benchmark module under ``bench/`` returns a list of :class:`Row` (or dicts with
the same keys); ``bench/run_all.py`` prints them as one table and, with
``--write-results``, appends a dated section to ``docs/benchmarks.md`` through
:func:`write_results`.

:class:`GoodputJob` is the one definition of the goodput job, so that the Cairn side
and the Ray Train reference run the identical workload: same step length, same
checkpoint cadence, same injected crashes, and the same pure definition of "useful"
(:meth:`GoodputJob.summarize`). :func:`goodput_train_loop` is that job's training
function, written once against the Ray-Train-shaped API that both libraries share.

This module imports nothing beyond the standard library at import time, so worker
processes of either library can import it cheaply.
"""

from __future__ import annotations

import dataclasses
import datetime as _datetime
import importlib
import importlib.metadata
import json
import math
import numbers
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

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


# --------------------------------------------------------------------------------------
# Checkpoint payloads
# --------------------------------------------------------------------------------------


def make_checkpoint_dir(path: str | os.PathLike[str], size_mib: float, num_files: int = 8) -> int:
    """Fill ``path`` with ``num_files`` files totalling ``size_mib`` MiB; return the bytes.

    The bytes are random (written from one random MiB with a per-MiB counter, so that
    no two MiB are equal and writing stays fast), so compression or deduplication in a
    store cannot flatter either side.
    """
    if num_files < 1:
        raise ValueError(f"num_files must be at least 1, got {num_files!r}")
    total = int(size_mib * 2**20)
    os.makedirs(path, exist_ok=True)
    block = bytearray(os.urandom(2**20))
    per_file = total // num_files
    counter = 0
    for index in range(num_files):
        size = per_file + (total - per_file * num_files if index == num_files - 1 else 0)
        with open(os.path.join(path, f"shard_{index:03d}.bin"), "wb") as f:
            remaining = size
            while remaining > 0:
                counter += 1
                block[:8] = counter.to_bytes(8, "little")
                chunk = min(remaining, len(block))
                f.write(block[:chunk] if chunk < len(block) else block)
                remaining -= chunk
    return total


# --------------------------------------------------------------------------------------
# The goodput job
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class GoodputJob:
    """A fixed training job with injected crashes; both sides run exactly this.

    The job is ``num_steps`` steps of ``step_s`` seconds of (sleeping) work, about
    ``duration_s`` of useful work in all. Every ``checkpoint_every_steps`` steps, and
    after the last step, every rank calls ``report()`` with the step in its metrics;
    rank 0 passes a checkpoint (``state.json`` with the step, plus ``checkpoint_mib`` of
    payload) and the other ranks pass ``None``. Rank ``crash_rank`` calls ``os._exit(1)``
    at the start of each step in :attr:`crash_steps`, the first time it reaches it
    (marker files in the work directory remember it across restarts). ``crash_at`` is
    in seconds of useful progress and is placed between checkpoints, so each crash loses
    work unless recovery is exact.
    """

    duration_s: float = 60.0
    step_s: float = 0.25
    checkpoint_every_s: float = 5.0
    crash_at: tuple[float, ...] = (22.5, 47.5)
    crash_rank: int = 1
    checkpoint_mib: float = 4.0
    num_workers: int = 2

    def __post_init__(self) -> None:
        for name in ("duration_s", "step_s", "checkpoint_every_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"GoodputJob.{name} must be > 0, got {value!r}")
        if self.step_s > self.duration_s:
            raise ValueError(
                f"GoodputJob.step_s ({self.step_s!r}) must not exceed duration_s "
                f"({self.duration_s!r})"
            )
        # Lists arrive from JSON and from configs; keep the dataclass hashable.
        object.__setattr__(self, "crash_at", tuple(float(t) for t in self.crash_at))
        for t in self.crash_at:
            if not 0 < t < self.duration_s:
                raise ValueError(
                    f"GoodputJob.crash_at values must lie in (0, duration_s={self.duration_s!r}),"
                    f" got {t!r}"
                )
        if not 0 <= self.crash_rank < self.num_workers:
            raise ValueError(
                f"GoodputJob.crash_rank must be in [0, num_workers={self.num_workers}), "
                f"got {self.crash_rank!r}"
            )
        if self.checkpoint_mib < 0:
            raise ValueError(f"GoodputJob.checkpoint_mib must be >= 0, got {self.checkpoint_mib!r}")

    @property
    def num_steps(self) -> int:
        return max(1, round(self.duration_s / self.step_s))

    @property
    def checkpoint_every_steps(self) -> int:
        return max(1, round(self.checkpoint_every_s / self.step_s))

    @property
    def crash_steps(self) -> tuple[int, ...]:
        last = self.num_steps - 1
        return tuple(sorted({min(last, round(t / self.step_s)) for t in self.crash_at}))

    @property
    def useful_s(self) -> float:
        """Useful step time of a completed run: every step counted once."""
        return self.num_steps * self.step_s

    def is_checkpoint_step(self, step: int) -> bool:
        return (step + 1) % self.checkpoint_every_steps == 0 or step == self.num_steps - 1

    def to_config(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["crash_at"] = list(self.crash_at)
        return data

    @classmethod
    def from_config(cls, data: Mapping[str, Any]) -> GoodputJob:
        return cls(**dict(data))

    def summarize(self, wall_s: float, executed_steps: Sequence[int]) -> dict[str, Any]:
        """What the run achieved, from its wall time and every step it executed.

        A step is useful once: executing it again after a rollback is lost work, so the
        useful time is ``step_s`` times the number of distinct steps executed. Goodput is
        useful time over wall time. Pure: no clocks, no files.
        """
        if wall_s <= 0:
            raise ValueError(f"wall_s must be > 0, got {wall_s!r}")
        valid = [s for s in executed_steps if 0 <= s < self.num_steps]
        distinct = len(set(valid))
        useful = distinct * self.step_s
        return {
            "wall_s": wall_s,
            "useful_s": useful,
            "goodput": useful / wall_s,
            "steps_executed": len(valid),
            "steps_redone": len(valid) - distinct,
            "redone_s": (len(valid) - distinct) * self.step_s,
            "completed": distinct == self.num_steps,
        }


GOODPUT_JOB = GoodputJob()
"""The full job: a minute of useful steps, a checkpoint every 5 s, two crashes."""

GOODPUT_JOB_QUICK = GoodputJob(duration_s=20.0, checkpoint_every_s=2.5, crash_at=(7.0, 14.5))
"""The ``--quick`` job: 20 s of useful steps, a checkpoint every 2.5 s, two crashes."""


def goodput_job(quick: bool) -> GoodputJob:
    return GOODPUT_JOB_QUICK if quick else GOODPUT_JOB


def goodput_steps_log(work_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(work_dir) / f"goodput_steps_rank{rank}.log"


def read_goodput_log(work_dir: str | os.PathLike[str], rank: int = 0) -> tuple[list[int], int]:
    """The steps a rank executed, in order, and how many attempts it started."""
    steps: list[int] = []
    attempts = 0
    log = goodput_steps_log(work_dir, rank)
    if not log.exists():
        return steps, attempts
    for line in log.read_text(encoding="utf-8").splitlines():
        kind, _, value = line.partition(" ")
        if kind == "start":
            attempts += 1
        elif kind == "step":
            steps.append(int(value))
    return steps, attempts


def goodput_train_loop(config: Mapping[str, Any]) -> None:
    """The goodput job's training function, for any library with Ray Train's API.

    ``config``: ``job`` (``GoodputJob.to_config()``), ``api`` (the module to import the
    API from: ``"ray.train"`` or ``"cairn"``) and ``work_dir`` (a directory every worker
    can write: step logs, crash markers, scratch checkpoint directories).
    """
    api = importlib.import_module(str(config["api"]))
    job = GoodputJob.from_config(config["job"])
    work_dir = Path(str(config["work_dir"]))
    rank = int(api.get_context().get_world_rank())

    start = 0
    checkpoint = api.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            state = json.loads(Path(directory, "state.json").read_text(encoding="utf-8"))
        start = int(state["step"]) + 1

    with open(goodput_steps_log(work_dir, rank), "a", encoding="utf-8") as log:
        log.write(f"start {start}\n")
        log.flush()
        for step in range(start, job.num_steps):
            if rank == job.crash_rank and step in job.crash_steps:
                marker = work_dir / f"crashed_at_step_{step}"
                if not marker.exists():
                    marker.touch()
                    log.flush()
                    os._exit(1)
            time.sleep(job.step_s)
            log.write(f"step {step}\n")
            log.flush()
            if not job.is_checkpoint_step(step):
                continue
            metrics = {"step": step}
            if rank != 0:
                api.report(metrics, checkpoint=None)
                continue
            scratch = tempfile.mkdtemp(prefix=f"goodput_step{step}_", dir=work_dir)
            try:
                Path(scratch, "state.json").write_text(json.dumps({"step": step}), encoding="utf-8")
                if job.checkpoint_mib > 0:
                    make_checkpoint_dir(scratch, job.checkpoint_mib, num_files=1)
                api.report(metrics, checkpoint=api.Checkpoint.from_directory(scratch))
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
