"""Ray Train 2.60 measured doing what the Cairn benchmarks measure.

Every public ``ray_*`` function runs its measurement in a fresh Python subprocess
(``bench/_ray_children.py`` run with ``--child``): its own ``ray.init(num_cpus=...)`` and
``ray.shutdown()``, its own environment (the Ray Train v2 API switched on with
``RAY_TRAIN_V2_ENABLED=1``, usage stats off), its own temporary storage path. So they
can be called one after another from one process, in any order, and a crash or a hang
in Ray stays in the child (which is killed with its process group on timeout).

Results are plain floats and dicts and are cached per process, keyed by the arguments
(failures too): ``bench/run_all.py`` and the benchmark modules can ask for the same
figure, or call :func:`reference_rows` for the same group, and Ray runs once.

With ``--quick`` (:func:`prefetch`, which :func:`reference_rows` calls and ``run_all``
calls up front for every group it will need) the start-up, report, transfer, snapshot
and recovery figures come from one child instead of five: one ``ray.init``, the start-up
fit first (so it still sees a fresh session; the metric reports at the fast poll interval
follow its first line), then the within-fit measurements as phases of one shared fit.
The goodput job keeps a child (a fresh
session) of its own, since its wall time includes its fit's start, which is faster in a
session that has run a fit before. Why the shared session and fit do not bias the
figures is in ``_ray_children._child_quick_session``. The results go into the same cache
entries as the separate measurements', so a figure means the same either way; the full
run (without ``--quick``) keeps one child per measurement.

What "blocked" means is the same on both sides: wall time around the call, as seen by
the training function on rank 0 (``time.perf_counter``). Times between processes
(driver to worker, crash to restore) use ``time.time`` on one machine.

Ray details this relies on, read from the Ray 2.60 source:

* The v2 API is the default in 2.60 (``ray.train.v2._internal.constants.is_v2_enabled``
  reads ``RAY_TRAIN_V2_ENABLED``, default on); the child sets it to 1 anyway.
* A worker's ``report()`` puts its result on a queue of size 1 that the controller
  drains when it polls the worker group, every ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``
  seconds (default 2.0; the driver's value is propagated to the controller). So
  back-to-back metric reports block for about one poll interval each.
* ``report(checkpoint_upload_mode=CheckpointUploadMode.ASYNC)`` uploads on a background
  thread and deletes the local directory afterwards by default.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

try:
    import _harness
    import _ray_children
except ImportError:  # imported as bench._ray_reference with only the repo root on the path
    from bench import _harness, _ray_children  # type: ignore[no-redef]

GoodputJob = _harness.GoodputJob
Row = _harness.Row

RAY_REFERENCE_NAME = _harness.RAY_REFERENCE_NAME
POLL_INTERVAL_ENV = _ray_children.POLL_INTERVAL_ENV
DEFAULT_POLL_INTERVAL_S = _ray_children.DEFAULT_POLL_INTERVAL_S

# Metric names of the reference rows; a benchmark module that uses the same
# (benchmark, metric) gets its reference column filled in by run_all.
METRIC_REPORT_MEDIAN = "metric-only report() median"
METRIC_REPORT_P99 = "metric-only report() p99"
METRIC_REPORT_FAST_MEDIAN = "metric-only report() median, 10 ms poll"
METRIC_REPORT_FAST_P99 = "metric-only report() p99, 10 ms poll"
METRIC_FIT_TO_FIRST_LINE = "fit() to first train line, 2 workers"
METRIC_FIT_TO_FIRST_LINE_PLAIN = "fit() to first train line, 2 workers, plain Trainer"
METRIC_RAY_INIT = "ray.init()"
METRIC_SYNC_REPORT = "SYNC report() 256 MiB"
METRIC_ASYNC_REPORT = "ASYNC report() blocking 256 MiB"
METRIC_RECOVERY = "crash to first step after restore"
METRIC_RECOVERY_BEHIND = "checkpoints behind last SYNC report"
METRIC_GOODPUT = "goodput"
METRIC_GOODPUT_WALL = "goodput job wall time"
METRIC_SNAPSHOT = "torch.save + ASYNC report() blocking 500 MB"

logger = logging.getLogger(__name__)

_CACHE: dict[tuple[str, str], dict[str, Any]] = {}
_FAILED: dict[tuple[str, str], RayReferenceError] = {}


class RayReferenceError(RuntimeError):
    """A Ray reference measurement failed; the message ends with the child's log.

    ``partial`` is what the child had written to its ``result.json`` before it failed
    (empty when nothing).
    """

    def __init__(self, message: str, partial: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.partial: dict[str, Any] = dict(partial or {})


def ray_version() -> str | None:
    """The installed Ray version, or None when Ray is not installed (nothing is imported)."""
    version = _harness.package_version("ray")
    return None if version == "not installed" else version


# --------------------------------------------------------------------------------------
# Public measurements (parent side)
# --------------------------------------------------------------------------------------


def ray_metric_report_latency(
    num_reports: int = 20,
    num_workers: int = 2,
    *,
    fast_poll_num_reports: int = 200,
    fast_poll_interval_s: float = 0.01,
) -> dict[str, float]:
    """Seconds a metric-only ``report()`` blocks, back to back, as seen by the workers.

    Two runs in one Ray session: ``num_reports`` reports with Ray's default poll
    interval (2 s), then ``fast_poll_num_reports`` with ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``
    at ``fast_poll_interval_s`` (skipped when 0). Samples of all ranks are pooled.
    Keys: ``median_s``, ``p99_s``, ``num_samples``, ``fast_poll_median_s``,
    ``fast_poll_p99_s``, ``fast_poll_num_samples``, ``fast_poll_interval_s``.
    """
    return _measure(
        "metric_report_latency",
        num_reports=num_reports,
        num_workers=num_workers,
        fast_poll_num_reports=fast_poll_num_reports,
        fast_poll_interval_s=fast_poll_interval_s,
    )


def ray_fit_to_first_line(num_workers: int = 2, *, trainer: str = "torch") -> dict[str, float]:
    """Seconds from ``trainer.fit()`` to the first line of the train function.

    ``trainer``: ``"torch"`` (``ray.train.torch.TorchTrainer``, which also sets up
    ``torch.distributed``) or ``"data_parallel"`` (the plain v2 ``DataParallelTrainer``).
    Keys: ``ray_init_s`` (``ray.init`` alone, before), ``fit_to_first_line_s`` (until the
    last rank started), ``fit_to_first_line_min_s`` (the first rank), ``fit_total_s``
    (until ``fit()`` returned; the function returns at once).
    """
    if trainer not in ("torch", "data_parallel"):
        raise ValueError(f"trainer must be 'torch' or 'data_parallel', got {trainer!r}")
    return _measure("fit_to_first_line", num_workers=num_workers, trainer=trainer)


def ray_checkpoint_report_modes(
    size_mib: float = 256,
    modes: Sequence[str] = ("sync", "async"),
    *,
    repeats: int = 3,
    num_files: int = 8,
    num_workers: int = 2,
) -> dict[str, float]:
    """Median seconds ``report()`` blocks with a checkpoint of ``size_mib`` MiB, per mode.

    One Ray run; rank 0 passes a fresh directory of ``num_files`` files each time, the
    other ranks pass ``None``; ``repeats`` timed reports per mode, each after the report
    queue has drained. ``"sync"`` is Ray's default upload (``pyarrow.fs.copy_files`` to the
    storage path before returning), ``"async"`` is
    ``CheckpointUploadMode.ASYNC``. Keys: the modes, and ``<mode>_samples``.
    """
    normalized = tuple(_normalize_mode(m) for m in modes)
    return _measure(
        "checkpoint_report",
        size_mib=size_mib,
        modes=list(normalized),
        repeats=repeats,
        num_files=num_files,
        num_workers=num_workers,
    )


def ray_checkpoint_report(
    size_mib: float = 256,
    mode: str = "sync",
    *,
    repeats: int = 3,
    num_files: int = 8,
    num_workers: int = 2,
) -> float:
    """Median seconds ``report()`` blocks with a ``size_mib`` checkpoint in ``mode``.

    Both modes are measured in one run (and cached), so asking for the other mode next
    costs nothing.
    """
    key = _normalize_mode(mode)
    both = ray_checkpoint_report_modes(
        size_mib,
        ("sync", "async"),
        repeats=repeats,
        num_files=num_files,
        num_workers=num_workers,
    )
    return float(both[key])


def ray_recovery(
    num_workers: int = 2, *, step_s: float = 0.5, crash_after_report: int = 3
) -> dict[str, float]:
    """Worker crash to first step after restore, and which checkpoint Ray resumed from.

    Every step reports a SYNC checkpoint (rank 0) holding the step number. On the first
    attempt, rank 0 calls ``os._exit(1)`` right after the report of step
    ``crash_after_report`` returned, having written the wall time. The restarted attempt
    writes the wall time once it has loaded its checkpoint. ``FailureConfig(max_failures=1)``.
    Keys: ``crash_to_first_step_s``, ``last_reported_step``, ``resumed_from_step``
    (-1: no checkpoint), ``checkpoints_behind``, ``fit_total_s``.
    """
    return _measure(
        "recovery",
        num_workers=num_workers,
        step_s=step_s,
        crash_after_report=crash_after_report,
    )


def ray_goodput(
    duration_s: float = 60.0,
    step_s: float = 0.25,
    checkpoint_every_s: float = 5.0,
    crash_at: Sequence[float] = (22.5, 47.5),
    *,
    checkpoint_mib: float = 4.0,
    num_workers: int = 2,
    crash_rank: int = 1,
) -> dict[str, Any]:
    """Goodput of Ray Train running the :class:`GoodputJob` with these parameters."""
    job = GoodputJob(
        duration_s=duration_s,
        step_s=step_s,
        checkpoint_every_s=checkpoint_every_s,
        crash_at=tuple(crash_at),
        checkpoint_mib=checkpoint_mib,
        num_workers=num_workers,
        crash_rank=crash_rank,
    )
    return ray_goodput_job(job)


def ray_goodput_job(job: _harness.GoodputJob) -> dict[str, Any]:
    """Goodput of Ray Train running ``job`` (``bench._harness.goodput_train_loop``).

    Wall time is ``fit()`` call to return (``ray.init`` excluded, reported as
    ``ray_init_s``). Keys: those of :meth:`GoodputJob.summarize` plus ``attempts``
    and ``ray_init_s``.
    """
    return _measure("goodput", job=job.to_config())


def ray_snapshot_async_torch_save_detail(
    state_mb: float = 500, *, repeats: int = 2, num_workers: int = 2
) -> dict[str, float]:
    """Keys: ``blocking_s`` (median of save + report), ``save_s``, ``report_s``, ``repeats``."""
    return _measure(
        "snapshot_async_torch_save",
        state_mb=state_mb,
        repeats=repeats,
        num_workers=num_workers,
    )


def ray_snapshot_async_torch_save(
    state_mb: float = 500, *, repeats: int = 2, num_workers: int = 2
) -> float:
    """Seconds the train loop is blocked to ``torch.save`` a ``state_mb`` MB state dict
    into a directory and ``report()`` it with ``CheckpointUploadMode.ASYNC`` (median)."""
    detail = ray_snapshot_async_torch_save_detail(
        state_mb, repeats=repeats, num_workers=num_workers
    )
    return float(detail["blocking_s"])


REFERENCE_GROUPS = ("report", "startup", "transfer", "recovery", "goodput", "snapshot")
"""The benchmarks :func:`reference_rows` has Ray figures for, in the order it runs them."""


QUICK_SESSION_GROUPS = ("startup", "report", "transfer", "snapshot", "recovery")
"""The groups whose ``--quick`` figures :func:`prefetch` measures in one shared session."""

NUM_WORKERS = 2
QUICK_METRIC_REPORTS, QUICK_FAST_POLL_REPORTS = 4, 100
FULL_METRIC_REPORTS, FULL_FAST_POLL_REPORTS = 20, 200
FAST_POLL_INTERVAL_S = 0.01
CHECKPOINT_MIB, CHECKPOINT_FILES = 256, 8
SNAPSHOT_MB = 500
QUICK_SESSION_TIMEOUT_S = 900.0


def _quick_plan() -> dict[str, tuple[str, str, dict[str, Any]]]:
    """Session part -> (group, kind, kwargs): the cache keys of the quick measurements.

    The kwargs are exactly those that :func:`reference_rows` passes (through the public
    functions) with ``quick=True``; ``tests/bench`` checks that after :func:`prefetch`
    it finds every one of them cached.
    """
    return {
        "startup": ("startup", "fit_to_first_line",
                    {"num_workers": NUM_WORKERS, "trainer": "torch"}),
        "metric": ("report", "metric_report_latency", {
            "num_reports": QUICK_METRIC_REPORTS,
            "num_workers": NUM_WORKERS,
            "fast_poll_num_reports": QUICK_FAST_POLL_REPORTS,
            "fast_poll_interval_s": FAST_POLL_INTERVAL_S,
        }),
        "checkpoint": ("transfer", "checkpoint_report", {
            "size_mib": CHECKPOINT_MIB,
            "modes": ["sync", "async"],
            "repeats": 1,
            "num_files": CHECKPOINT_FILES,
            "num_workers": NUM_WORKERS,
        }),
        "snapshot": ("snapshot", "snapshot_async_torch_save",
                     {"state_mb": SNAPSHOT_MB, "repeats": 1, "num_workers": NUM_WORKERS}),
        "recovery": ("recovery", "recovery",
                     {"num_workers": NUM_WORKERS, "step_s": 0.5, "crash_after_report": 3}),
    }


def prefetch(groups: Sequence[str], *, quick: bool = True) -> None:
    """Measure the ``--quick`` figures of ``groups`` in one shared Ray session (cached).

    Does nothing without ``quick``, and for figures already cached or failed. A part of
    the session that fails is cached as failed (its figure becomes an error row, as a
    failed measurement of its own would), the parts that finished are kept.
    """
    if not quick:
        return
    plan = {
        part: (kind, kwargs)
        for part, (group, kind, kwargs) in _quick_plan().items()
        if group in groups and _key(kind, kwargs) not in _CACHE
        and _key(kind, kwargs) not in _FAILED
    }
    if not plan:
        return
    session: dict[str, Any] = {"num_workers": NUM_WORKERS}
    for part, (_, kwargs) in plan.items():
        session[part] = {k: v for k, v in kwargs.items() if k != "num_workers"}
    logger.info("Ray reference: one quick session for %s", ", ".join(plan))
    failure: RayReferenceError | None = None
    try:
        result = _run_child("quick_session", session, QUICK_SESSION_TIMEOUT_S)
    except RayReferenceError as exc:
        failure, result = exc, exc.partial
    errors: dict[str, str] = result.get("errors") or {}
    for part, (kind, kwargs) in plan.items():
        if isinstance(result.get(part), dict):
            _CACHE[_key(kind, kwargs)] = dict(result[part])
            continue
        reason = errors.get(part) or str(failure or "no result")
        _FAILED[_key(kind, kwargs)] = RayReferenceError(
            f"Ray reference {kind!r} failed in the quick session: {reason}"
        )


def reference_rows(quick: bool = False, groups: Sequence[str] | None = None) -> list[_harness.Row]:
    """Ray reference figures as rows (reference column only), for ``run_all``.

    ``groups`` selects benchmarks from :data:`REFERENCE_GROUPS` (default: all).
    ``quick`` keeps the whole set under about four minutes on two cores: fewer reports,
    one repeat per checkpoint mode, the short goodput job, one trainer for start-up.
    A measurement that fails becomes an error row; the others still run.
    """
    selected = REFERENCE_GROUPS if groups is None else tuple(groups)
    unknown = sorted(set(selected) - set(REFERENCE_GROUPS))
    if unknown:
        raise ValueError(f"unknown reference group(s) {unknown}; known: {list(REFERENCE_GROUPS)}")
    rows: list[_harness.Row] = []
    prefetch(selected, quick=quick)
    shared = "; quick: one Ray session, a phase of one shared fit" if quick else ""

    def ref(benchmark: str, metric: str, value: float | None, unit: str, note: str) -> None:
        rows.append(Row(benchmark=benchmark, metric=metric, reference=value, unit=unit, note=note))

    def attempt(benchmark: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as exc:  # one failed measurement must not hide the rest
            logger.exception("Ray reference %s failed", benchmark)
            rows.append(_harness.error_row(benchmark, exc, metric="Ray reference error"))

    num_reports, fast_reports = (
        (QUICK_METRIC_REPORTS, QUICK_FAST_POLL_REPORTS)
        if quick
        else (FULL_METRIC_REPORTS, FULL_FAST_POLL_REPORTS)
    )

    def report_latency() -> None:
        r = ray_metric_report_latency(num_reports, fast_poll_num_reports=fast_reports)
        n, nf = int(r["num_samples"]), int(r["fast_poll_num_samples"])
        ref(
            "report",
            METRIC_REPORT_MEDIAN,
            r["median_s"],
            "s",
            f"{n} samples ({num_reports} back-to-back reports x 2 ranks), default 2 s poll"
            + shared,
        )
        ref("report", METRIC_REPORT_P99, r["p99_s"], "s", f"{n} samples, default 2 s poll")
        ref(
            "report",
            METRIC_REPORT_FAST_MEDIAN,
            r["fast_poll_median_s"],
            "s",
            f"{nf} samples, {POLL_INTERVAL_ENV}=0.01",
        )
        ref(
            "report",
            METRIC_REPORT_FAST_P99,
            r["fast_poll_p99_s"],
            "s",
            f"{nf} samples, {POLL_INTERVAL_ENV}=0.01",
        )

    def startup() -> None:
        r = ray_fit_to_first_line(trainer="torch")
        ref(
            "startup",
            METRIC_FIT_TO_FIRST_LINE,
            r["fit_to_first_line_s"],
            "s",
            "TorchTrainer, last rank's first line; fresh Ray session"
            + ("; quick: the first fit of the shared session" if quick else ""),
        )
        ref("startup", METRIC_RAY_INIT, r["ray_init_s"], "s", "ray.init(num_cpus=2), not in fit()")
        if not quick:
            plain = ray_fit_to_first_line(trainer="data_parallel")
            ref(
                "startup",
                METRIC_FIT_TO_FIRST_LINE_PLAIN,
                plain["fit_to_first_line_s"],
                "s",
                "v2 DataParallelTrainer (no torch.distributed)",
            )

    repeats = 1 if quick else 3

    def checkpoint_report() -> None:
        r = ray_checkpoint_report_modes(CHECKPOINT_MIB, ("sync", "async"), repeats=repeats)
        ref(
            "transfer",
            METRIC_SYNC_REPORT,
            r["sync"],
            "s",
            f"8 files, local storage, median of {repeats}; default upload" + shared,
        )
        ref(
            "transfer",
            METRIC_ASYNC_REPORT,
            r["async"],
            "s",
            f"CheckpointUploadMode.ASYNC, median of {repeats}",
        )

    def recovery() -> None:
        r = ray_recovery()
        ref(
            "recovery",
            METRIC_RECOVERY,
            r["crash_to_first_step_s"],
            "s",
            "os._exit(1) on rank 0 right after a SYNC checkpoint report returned" + shared,
        )
        ref(
            "recovery",
            METRIC_RECOVERY_BEHIND,
            r["checkpoints_behind"],
            "ckpts",
            f"last reported step {int(r['last_reported_step'])}, "
            f"resumed from step {int(r['resumed_from_step'])}",
        )

    def goodput() -> None:
        job = _harness.goodput_job(quick)
        r = ray_goodput_job(job)
        detail = (
            f"{'quick' if quick else 'full'} GoodputJob: {job.useful_s:g} s useful, "
            f"ckpt every {job.checkpoint_every_s:g} s, crashes at {list(job.crash_at)} s; "
            f"{int(r['attempts'])} attempts, {r['redone_s']:.2f} s redone"
        )
        ref("goodput", METRIC_GOODPUT, r["goodput"], "fraction", "higher is better; " + detail)
        ref("goodput", METRIC_GOODPUT_WALL, r["wall_s"], "s", "fit() call to return")

    def snapshot() -> None:
        r = ray_snapshot_async_torch_save_detail(SNAPSHOT_MB, repeats=1 if quick else 2)
        ref(
            "snapshot",
            METRIC_SNAPSHOT,
            r["blocking_s"],
            "s",
            f"torch.save {r['save_s']:.2f} s + report {r['report_s']:.3f} s (medians)" + shared,
        )

    measurements = {
        "report": report_latency,
        "startup": startup,
        "transfer": checkpoint_report,
        "recovery": recovery,
        "goodput": goodput,
        "snapshot": snapshot,
    }
    for group in REFERENCE_GROUPS:
        if group in selected:
            attempt(group, measurements[group])
    return rows


# --------------------------------------------------------------------------------------
# Running a measurement in a child process
# --------------------------------------------------------------------------------------


def _normalize_mode(mode: str) -> str:
    value = str(getattr(mode, "value", mode)).lower()
    if value not in ("sync", "async"):
        raise ValueError(f"mode must be 'sync' or 'async', got {mode!r}")
    return value


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["RAY_TRAIN_V2_ENABLED"] = "1"
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    # The poll interval is set per run inside the child; never inherit one.
    env.pop(POLL_INTERVAL_ENV, None)
    # Ray workers unpickle functions of ``_harness`` by module name.
    paths = [str(_harness.BENCH_DIR), str(_harness.REPO_ROOT)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def _key(kind: str, kwargs: dict[str, Any]) -> tuple[str, str]:
    return (kind, json.dumps(kwargs, sort_keys=True))


def _measure(kind: str, *, timeout_s: float = 600.0, **kwargs: Any) -> dict[str, Any]:
    key = _key(kind, kwargs)
    if key in _CACHE:
        return dict(_CACHE[key])
    if key in _FAILED:
        # A benchmark module and run_all ask for the same figure: a failure (possibly a
        # ten-minute timeout) is not paid twice.
        raise _FAILED[key]
    try:
        result = _run_child(kind, kwargs, timeout_s)
    except RayReferenceError as exc:
        _FAILED[key] = exc
        raise
    _CACHE[key] = result
    return dict(result)


def _run_child(kind: str, kwargs: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"cairn-bench-ray-{kind}-") as work_dir:
        result_path = Path(work_dir, "result.json")
        log_path = Path(work_dir, "child.log")
        command = [
            sys.executable,
            str(Path(_ray_children.__file__).resolve()),
            "--child",
            kind,
            "--kwargs",
            json.dumps(kwargs),
            "--work-dir",
            work_dir,
        ]
        with open(log_path, "wb") as log:
            # A session of its own, so that on timeout the child and every Ray process
            # it started are killed together, and nothing else.
            proc = subprocess.Popen(
                command,
                env=_child_env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                returncode = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                raise RayReferenceError(
                    f"Ray reference {kind!r} did not finish in {timeout_s:.0f} s; "
                    f"last lines of its log:\n{_tail(log_path)}",
                    _read_partial(result_path),
                ) from None
            finally:
                _kill_group(proc, only_leftovers=True)
        if returncode != 0 or not result_path.exists():
            raise RayReferenceError(
                f"Ray reference {kind!r} failed (exit status {returncode}): "
                f"{_tail(log_path, 1)}\nlast lines of its log:\n{_tail(log_path)}",
                _read_partial(result_path),
            )
        result = json.loads(result_path.read_text(encoding="utf-8"))
    logger.info("Ray reference %s took %.1f s: %s", kind, time.perf_counter() - started, result)
    return dict(result)


def _read_partial(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _kill_group(proc: subprocess.Popen[bytes], *, only_leftovers: bool = False) -> None:
    """Kill the child's process group (the child and the Ray processes it started)."""
    try:
        pgid = os.getpgid(proc.pid) if proc.poll() is None else proc.pid
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return
    if not only_leftovers:
        proc.wait()


def _tail(path: Path, lines: int = 40) -> str:
    """The last non-blank lines of a log (the exception, when the child raised)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join([line for line in text.splitlines() if line.strip()][-lines:])
