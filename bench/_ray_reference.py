"""Ray Train 2.60 measured doing what the Cairn benchmarks measure.

Every public ``ray_*`` function runs its measurement in a fresh Python subprocess
(this file run with ``--child``): its own ``ray.init(num_cpus=...)`` and
``ray.shutdown()``, its own environment (the Ray Train v2 API switched on with
``RAY_TRAIN_V2_ENABLED=1``, usage stats off), its own temporary storage path. So they
can be called one after another from one process, in any order, and a crash or a hang
in Ray stays in the child (which is killed with its process group on timeout).

Results are plain floats and dicts and are cached per process, keyed by the arguments:
``bench/run_all.py`` and the benchmark modules can ask for the same figure and Ray runs
once.

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

import argparse
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

try:
    import _harness
except ImportError:  # imported as bench._ray_reference with only the repo root on the path
    from bench import _harness  # type: ignore[no-redef]

GoodputJob = _harness.GoodputJob
Row = _harness.Row

RAY_REFERENCE_NAME = _harness.RAY_REFERENCE_NAME
POLL_INTERVAL_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"
DEFAULT_POLL_INTERVAL_S = 2.0

# Seconds to let the controller drain a worker's report queue (one poll interval at the
# default 2.0 s, with slack) before a timed checkpoint report, so that the figure is the
# checkpoint's cost and not the wait for the previous report to be consumed.
_DRAIN_S = 2.6

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


class RayReferenceError(RuntimeError):
    """A Ray reference measurement failed; the message ends with the child's log."""


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

    def ref(benchmark: str, metric: str, value: float | None, unit: str, note: str) -> None:
        rows.append(Row(benchmark=benchmark, metric=metric, reference=value, unit=unit, note=note))

    def attempt(benchmark: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as exc:  # one failed measurement must not hide the rest
            logger.exception("Ray reference %s failed", benchmark)
            rows.append(_harness.error_row(benchmark, exc, metric="Ray reference error"))

    num_reports, fast_reports = (6, 100) if quick else (20, 200)

    def report_latency() -> None:
        r = ray_metric_report_latency(num_reports, fast_poll_num_reports=fast_reports)
        n, nf = int(r["num_samples"]), int(r["fast_poll_num_samples"])
        ref(
            "report",
            METRIC_REPORT_MEDIAN,
            r["median_s"],
            "s",
            f"{n} samples ({num_reports} back-to-back reports x 2 ranks), default 2 s poll",
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
            "TorchTrainer, last rank's first line; fresh Ray session",
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
        r = ray_checkpoint_report_modes(256, ("sync", "async"), repeats=repeats)
        ref(
            "transfer",
            METRIC_SYNC_REPORT,
            r["sync"],
            "s",
            f"8 files, local storage, median of {repeats}; default upload",
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
            "os._exit(1) on rank 0 right after a SYNC checkpoint report returned",
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
        r = ray_snapshot_async_torch_save_detail(500, repeats=1 if quick else 2)
        ref(
            "snapshot",
            METRIC_SNAPSHOT,
            r["blocking_s"],
            "s",
            f"torch.save {r['save_s']:.2f} s + report {r['report_s']:.3f} s (medians)",
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


def _measure(kind: str, *, timeout_s: float = 600.0, **kwargs: Any) -> dict[str, Any]:
    key = (kind, json.dumps(kwargs, sort_keys=True))
    if key in _CACHE:
        return dict(_CACHE[key])
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"cairn-bench-ray-{kind}-") as work_dir:
        result_path = Path(work_dir, "result.json")
        log_path = Path(work_dir, "child.log")
        command = [
            sys.executable,
            str(Path(__file__).resolve()),
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
                    f"last lines of its log:\n{_tail(log_path)}"
                ) from None
            finally:
                _kill_group(proc, only_leftovers=True)
        if returncode != 0 or not result_path.exists():
            raise RayReferenceError(
                f"Ray reference {kind!r} failed (exit status {returncode}): "
                f"{_tail(log_path, 1)}\nlast lines of its log:\n{_tail(log_path)}"
            )
        result = json.loads(result_path.read_text(encoding="utf-8"))
    logger.info("Ray reference %s took %.1f s: %s", kind, time.perf_counter() - started, result)
    _CACHE[key] = result
    return dict(result)


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


# --------------------------------------------------------------------------------------
# Child side: everything below runs in the subprocess (and its Ray workers)
# --------------------------------------------------------------------------------------


def _write_json(path: str | os.PathLike[str], data: Any) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def _read_rank_files(out_dir: Path, tag: str) -> list[dict[str, Any]]:
    files = sorted(out_dir.glob(f"{tag}_rank*.json"))
    return [json.loads(p.read_text(encoding="utf-8")) for p in files]


def _init_ray(num_workers: int) -> float:
    import ray

    started = time.perf_counter()
    ray.init(
        num_cpus=max(2, num_workers),
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.WARNING,
    )
    return time.perf_counter() - started


def _fit(
    train_fn: Callable[..., Any],
    config: Mapping[str, Any],
    *,
    num_workers: int,
    storage: Path,
    name: str,
    trainer: str = "data_parallel",
    max_failures: int = 0,
) -> tuple[float, float]:
    """Run one training run; return (wall time at the ``fit()`` call, seconds it took)."""
    import ray.train

    kwargs: dict[str, Any] = {
        "train_loop_config": dict(config),
        "scaling_config": ray.train.ScalingConfig(num_workers=num_workers),
        "run_config": ray.train.RunConfig(
            name=name,
            storage_path=str(storage),
            failure_config=ray.train.FailureConfig(max_failures=max_failures),
        ),
    }
    if trainer == "torch":
        from ray.train.torch import TorchTrainer

        instance: Any = TorchTrainer(train_fn, **kwargs)
    else:
        from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

        instance = DataParallelTrainer(train_fn, **kwargs)
    fit_wall = time.time()
    started = time.perf_counter()
    instance.fit()
    return fit_wall, time.perf_counter() - started


def _train_metric_reports(config: dict[str, Any]) -> None:
    import ray.train

    rank = ray.train.get_context().get_world_rank()
    samples = []
    for step in range(int(config["num_reports"])):
        started = time.perf_counter()
        ray.train.report({"step": step})
        samples.append(time.perf_counter() - started)
    _write_json(Path(config["out"], f"{config['tag']}_rank{rank}.json"), {"samples": samples})


def _child_metric_report_latency(
    work_dir: Path,
    *,
    num_reports: int,
    num_workers: int,
    fast_poll_num_reports: int,
    fast_poll_interval_s: float,
) -> dict[str, Any]:
    out = work_dir / "out"
    out.mkdir()
    _init_ray(num_workers)
    result: dict[str, Any] = {"fast_poll_interval_s": fast_poll_interval_s}
    runs = [("default", num_reports, None)]
    if fast_poll_num_reports > 0:
        runs.append(("fast_poll", fast_poll_num_reports, fast_poll_interval_s))
    for tag, count, interval in runs:
        if interval is None:
            os.environ.pop(POLL_INTERVAL_ENV, None)
        else:
            # Read by the trainer at fit() and propagated to the controller actor.
            os.environ[POLL_INTERVAL_ENV] = str(interval)
        _fit(
            _train_metric_reports,
            {"num_reports": count, "out": str(out), "tag": tag},
            num_workers=num_workers,
            storage=work_dir / "storage",
            name=f"metric-latency-{tag}",
        )
        samples = [s for r in _read_rank_files(out, tag) for s in r["samples"]]
        prefix = "" if tag == "default" else "fast_poll_"
        result[f"{prefix}median_s"] = _harness.median(samples)
        result[f"{prefix}p99_s"] = _harness.p99(samples)
        result[f"{prefix}num_samples"] = len(samples)
    os.environ.pop(POLL_INTERVAL_ENV, None)
    if fast_poll_num_reports <= 0:
        result.update(fast_poll_median_s=None, fast_poll_p99_s=None, fast_poll_num_samples=0)
    return result


def _train_first_line(config: dict[str, Any]) -> None:
    first_line = time.time()
    import ray.train

    rank = ray.train.get_context().get_world_rank()
    _write_json(Path(config["out"], f"first_rank{rank}.json"), {"t": first_line})


def _child_fit_to_first_line(work_dir: Path, *, num_workers: int, trainer: str) -> dict[str, Any]:
    out = work_dir / "out"
    out.mkdir()
    ray_init_s = _init_ray(num_workers)
    fit_wall, fit_s = _fit(
        _train_first_line,
        {"out": str(out)},
        num_workers=num_workers,
        storage=work_dir / "storage",
        name="fit-to-first-line",
        trainer=trainer,
    )
    starts = [r["t"] - fit_wall for r in _read_rank_files(out, "first")]
    return {
        "ray_init_s": ray_init_s,
        "fit_to_first_line_s": max(starts),
        "fit_to_first_line_min_s": min(starts),
        "fit_total_s": fit_s,
    }


def _train_checkpoint_reports(config: dict[str, Any]) -> None:
    import ray.train

    rank = ray.train.get_context().get_world_rank()
    scratch = Path(config["scratch"])
    samples: dict[str, list[float]] = {}
    for mode in config["modes"]:
        upload_mode = ray.train.CheckpointUploadMode[mode.upper()]
        for repeat in range(int(config["repeats"])):
            checkpoint = None
            if rank == 0:
                directory = scratch / f"{mode}_{repeat}"
                _harness.make_checkpoint_dir(
                    directory, float(config["size_mib"]), int(config["num_files"])
                )
                checkpoint = ray.train.Checkpoint.from_directory(str(directory))
            # Let the previous report be consumed and any ASYNC upload finish.
            time.sleep(_DRAIN_S)
            started = time.perf_counter()
            ray.train.report(
                {"mode": mode, "repeat": repeat},
                checkpoint=checkpoint,
                checkpoint_upload_mode=upload_mode,
            )
            samples.setdefault(mode, []).append(time.perf_counter() - started)
    # Let the last ASYNC upload finish before the function returns.
    time.sleep(_DRAIN_S)
    _write_json(Path(config["out"], f"ckpt_rank{rank}.json"), {"samples": samples})


def _child_checkpoint_report(
    work_dir: Path,
    *,
    size_mib: float,
    modes: list[str],
    repeats: int,
    num_files: int,
    num_workers: int,
) -> dict[str, Any]:
    out = work_dir / "out"
    scratch = work_dir / "scratch"
    out.mkdir()
    scratch.mkdir()
    _init_ray(num_workers)
    _fit(
        _train_checkpoint_reports,
        {
            "out": str(out),
            "scratch": str(scratch),
            "modes": modes,
            "repeats": repeats,
            "size_mib": size_mib,
            "num_files": num_files,
        },
        num_workers=num_workers,
        storage=work_dir / "storage",
        name="checkpoint-report",
    )
    rank0 = json.loads((out / "ckpt_rank0.json").read_text(encoding="utf-8"))["samples"]
    result: dict[str, Any] = {}
    for mode in modes:
        result[mode] = _harness.median(rank0[mode])
        result[f"{mode}_samples"] = rank0[mode]
    return result


def _train_recovery(config: dict[str, Any]) -> None:
    import ray.train

    rank = ray.train.get_context().get_world_rank()
    out = Path(config["out"])
    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            restored = json.loads(Path(directory, "state.json").read_text(encoding="utf-8"))
        start = int(restored["step"]) + 1
    marker = out / "crashed"
    if rank == 0 and marker.exists():
        _write_json(
            out / "restore.json",
            {"t": time.time(), "resumed_from_step": start - 1},
        )
    crash_step = int(config["crash_after_report"])
    for step in range(start, crash_step + 3):
        time.sleep(float(config["step_s"]))
        scratch = None
        checkpoint = None
        if rank == 0:
            scratch = tempfile.mkdtemp(dir=config["scratch"])
            Path(scratch, "state.json").write_text(json.dumps({"step": step}), encoding="utf-8")
            checkpoint = ray.train.Checkpoint.from_directory(scratch)
        ray.train.report({"step": step}, checkpoint=checkpoint)
        if rank == 0 and step == crash_step and not marker.exists():
            _write_json(out / "crash.json", {"t": time.time(), "last_reported_step": step})
            marker.touch()
            os._exit(1)
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _child_recovery(
    work_dir: Path, *, num_workers: int, step_s: float, crash_after_report: int
) -> dict[str, Any]:
    out = work_dir / "out"
    scratch = work_dir / "scratch"
    out.mkdir()
    scratch.mkdir()
    _init_ray(num_workers)
    _, fit_s = _fit(
        _train_recovery,
        {
            "out": str(out),
            "scratch": str(scratch),
            "step_s": step_s,
            "crash_after_report": crash_after_report,
        },
        num_workers=num_workers,
        storage=work_dir / "storage",
        name="recovery",
        max_failures=1,
    )
    crash = json.loads((out / "crash.json").read_text(encoding="utf-8"))
    restore = json.loads((out / "restore.json").read_text(encoding="utf-8"))
    last, resumed = int(crash["last_reported_step"]), int(restore["resumed_from_step"])
    return {
        "crash_to_first_step_s": restore["t"] - crash["t"],
        "last_reported_step": last,
        "resumed_from_step": resumed,
        # One checkpoint per step, so steps behind are checkpoints behind.
        "checkpoints_behind": last - resumed,
        "fit_total_s": fit_s,
    }


def _child_goodput(work_dir: Path, *, job: dict[str, Any]) -> dict[str, Any]:
    spec = GoodputJob.from_config(job)
    ray_init_s = _init_ray(spec.num_workers)
    _, wall_s = _fit(
        _harness.goodput_train_loop,
        {"job": spec.to_config(), "api": "ray.train", "work_dir": str(work_dir)},
        num_workers=spec.num_workers,
        storage=work_dir / "storage",
        name="goodput",
        # One spare, so that an unexpected extra failure shows in ``attempts``
        # instead of failing the run.
        max_failures=len(spec.crash_steps) + 1,
    )
    steps, attempts = _harness.read_goodput_log(work_dir, rank=0)
    summary = spec.summarize(wall_s, steps)
    summary.update(attempts=attempts, ray_init_s=ray_init_s)
    return summary


def _train_snapshot(config: dict[str, Any]) -> None:
    import ray.train
    import torch

    rank = ray.train.get_context().get_world_rank()
    state: dict[str, Any] = {}
    if rank == 0:
        # float32 tensors of 25 MB each, about state_mb MB in all.
        total = int(float(config["state_mb"]) * 1e6) // 4
        per_tensor = 25_000_000 // 4
        index = 0
        while total > 0:
            count = min(per_tensor, total)
            state[f"layer_{index}.weight"] = torch.randn(count)
            total -= count
            index += 1
    save_samples: list[float] = []
    report_samples: list[float] = []
    for repeat in range(int(config["repeats"])):
        time.sleep(_DRAIN_S)
        started = time.perf_counter()
        checkpoint = None
        if rank == 0:
            directory = tempfile.mkdtemp(dir=config["scratch"])
            torch.save(state, os.path.join(directory, "model.pt"))
            checkpoint = ray.train.Checkpoint.from_directory(directory)
        saved = time.perf_counter()
        ray.train.report(
            {"repeat": repeat},
            checkpoint=checkpoint,
            checkpoint_upload_mode=ray.train.CheckpointUploadMode.ASYNC,
        )
        done = time.perf_counter()
        save_samples.append(saved - started)
        report_samples.append(done - saved)
    time.sleep(_DRAIN_S + 2.0)  # the last upload finishes before the run ends
    _write_json(
        Path(config["out"], f"snapshot_rank{rank}.json"),
        {"save": save_samples, "report": report_samples},
    )


def _child_snapshot_async_torch_save(
    work_dir: Path, *, state_mb: float, repeats: int, num_workers: int
) -> dict[str, Any]:
    out = work_dir / "out"
    scratch = work_dir / "scratch"
    out.mkdir()
    scratch.mkdir()
    _init_ray(num_workers)
    _fit(
        _train_snapshot,
        {"out": str(out), "scratch": str(scratch), "state_mb": state_mb, "repeats": repeats},
        num_workers=num_workers,
        storage=work_dir / "storage",
        name="snapshot",
    )
    rank0 = json.loads((out / "snapshot_rank0.json").read_text(encoding="utf-8"))
    totals = [s + r for s, r in zip(rank0["save"], rank0["report"], strict=True)]
    return {
        "blocking_s": _harness.median(totals),
        "save_s": _harness.median(rank0["save"]),
        "report_s": _harness.median(rank0["report"]),
        "repeats": repeats,
    }


_CHILDREN: dict[str, Callable[..., dict[str, Any]]] = {
    "metric_report_latency": _child_metric_report_latency,
    "fit_to_first_line": _child_fit_to_first_line,
    "checkpoint_report": _child_checkpoint_report,
    "recovery": _child_recovery,
    "goodput": _child_goodput,
    "snapshot_async_torch_save": _child_snapshot_async_torch_save,
}


def _child_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description="Run one Ray Train reference measurement.")
    parser.add_argument("--child", required=True, choices=sorted(_CHILDREN))
    parser.add_argument("--kwargs", required=True, help="JSON object of keyword arguments")
    parser.add_argument("--work-dir", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    work_dir = Path(args.work_dir)
    try:
        result = _CHILDREN[args.child](work_dir, **json.loads(args.kwargs))
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
    _write_json(work_dir / "result.json", result)
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
