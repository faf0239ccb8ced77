"""The child side of the Ray Train 2.60 reference: ``python bench/_ray_children.py --child``.

``bench/_ray_reference.py`` (the parent side) runs each measurement as this script in a
fresh Python process with its own ``ray.init`` and ``ray.shutdown``; the functions here
run in that process and in its Ray workers, and the result is written as JSON to
``<work dir>/result.json``. Ray is imported inside the functions, never at import time.
See ``_ray_reference`` for what each measurement means and which Ray details it relies on.

Each within-fit measurement is a *phase* (:class:`_Phase`: a train function, its config,
and a reader of what its ranks wrote), so that it can run as the only thing in a fit (a
child of its own, as always in full mode) or as one phase of the shared fit of the
``quick_session`` child (``--quick``; see :func:`_child_quick_session`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    import _harness
except ImportError:  # imported as bench._ray_children with only the repo root on the path
    from bench import _harness  # type: ignore[no-redef]

GoodputJob = _harness.GoodputJob

POLL_INTERVAL_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"
DEFAULT_POLL_INTERVAL_S = 2.0

# Seconds to let the controller drain a worker's report queue (one poll interval at the
# default 2.0 s, with slack) before a timed checkpoint report, so that the figure is the
# checkpoint's cost and not the wait for the previous report to be consumed.
_DRAIN_S = 2.6


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

    # Ray binds its node to 127.0.0.1 when multi-host clusters are off: no benchmark traffic
    # on the machine's network interface.
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
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


@dataclass(frozen=True)
class _Phase:
    """One within-fit measurement: what every rank runs, and how to read what they wrote."""

    train: Callable[[dict[str, Any]], None]
    config: dict[str, Any]
    read: Callable[[], dict[str, Any]]


def _metric_phase(work_dir: Path, tag: str, num_reports: int) -> _Phase:
    """``num_reports`` back-to-back metric reports; ``median_s``, ``p99_s``, ``num_samples``."""
    out = work_dir / f"out_metric_{tag}"
    out.mkdir()

    def read() -> dict[str, Any]:
        samples = [s for r in _read_rank_files(out, tag) for s in r["samples"]]
        return {
            "median_s": _harness.median(samples),
            "p99_s": _harness.p99(samples),
            "num_samples": len(samples),
        }

    return _Phase(
        _train_metric_reports, {"num_reports": num_reports, "out": str(out), "tag": tag}, read
    )


def _set_poll_interval(interval: float | None) -> None:
    if interval is None:
        os.environ.pop(POLL_INTERVAL_ENV, None)
    else:
        # Read by the trainer at fit() and propagated to the controller actor.
        os.environ[POLL_INTERVAL_ENV] = str(interval)


def _fast_poll_fit(
    work_dir: Path, *, num_workers: int, num_reports: int, interval: float
) -> dict[str, Any]:
    """The metric reports again, in a fit of their own with the poll interval at ``interval``."""
    phase = _metric_phase(work_dir, "fast_poll", num_reports)
    _set_poll_interval(interval)
    try:
        _fit(phase.train, phase.config, num_workers=num_workers, storage=work_dir / "storage",
             name="metric-latency-fast_poll")
    finally:
        _set_poll_interval(None)
    return {f"fast_poll_{key}": value for key, value in phase.read().items()}


def _no_fast_poll() -> dict[str, Any]:
    return {"fast_poll_median_s": None, "fast_poll_p99_s": None, "fast_poll_num_samples": 0}


def _child_metric_report_latency(
    work_dir: Path,
    *,
    num_reports: int,
    num_workers: int,
    fast_poll_num_reports: int,
    fast_poll_interval_s: float,
) -> dict[str, Any]:
    _init_ray(num_workers)
    result: dict[str, Any] = {"fast_poll_interval_s": fast_poll_interval_s}
    phase = _metric_phase(work_dir, "default", num_reports)
    _set_poll_interval(None)
    _fit(phase.train, phase.config, num_workers=num_workers, storage=work_dir / "storage",
         name="metric-latency-default")
    result.update(phase.read())
    if fast_poll_num_reports > 0:
        result.update(_fast_poll_fit(work_dir, num_workers=num_workers,
                                     num_reports=fast_poll_num_reports,
                                     interval=fast_poll_interval_s))
    else:
        result.update(_no_fast_poll())
    return result


def _train_first_line(config: dict[str, Any]) -> None:
    first_line = time.time()
    import ray.train

    rank = ray.train.get_context().get_world_rank()
    _write_json(Path(config["out"], f"first_rank{rank}.json"), {"t": first_line})


def _fit_to_first_line(work_dir: Path, *, num_workers: int, trainer: str,
                       then: _Phase | None = None) -> dict[str, Any]:
    """``fit()`` to the first line of the train function; ``then`` runs after that line."""
    out = work_dir / "out_first"
    out.mkdir()
    train: Callable[[dict[str, Any]], None] = _train_first_line
    config: dict[str, Any] = {"out": str(out)}
    if then is not None:
        train, config = _train_phases, {"phases": [(train, config), (then.train, then.config)]}
    fit_wall, fit_s = _fit(
        train,
        config,
        num_workers=num_workers,
        storage=work_dir / "storage",
        name="fit-to-first-line",
        trainer=trainer,
    )
    starts = [r["t"] - fit_wall for r in _read_rank_files(out, "first")]
    return {
        "fit_to_first_line_s": max(starts),
        "fit_to_first_line_min_s": min(starts),
        "fit_total_s": fit_s,
    }


def _child_fit_to_first_line(work_dir: Path, *, num_workers: int, trainer: str) -> dict[str, Any]:
    ray_init_s = _init_ray(num_workers)
    return {"ray_init_s": ray_init_s,
            **_fit_to_first_line(work_dir, num_workers=num_workers, trainer=trainer)}


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
    # Let the last ASYNC upload finish before the function returns (a phase followed by
    # one that drains before its first timed report may skip this).
    time.sleep(float(config.get("tail_s", _DRAIN_S)))
    _write_json(Path(config["out"], f"ckpt_rank{rank}.json"), {"samples": samples})


def _phase_dirs(work_dir: Path, name: str) -> tuple[Path, Path]:
    """A phase's new output and scratch directories under ``work_dir``."""
    out, scratch = work_dir / f"out_{name}", work_dir / f"scratch_{name}"
    out.mkdir()
    scratch.mkdir()
    return out, scratch


def _checkpoint_phase(
    work_dir: Path,
    *,
    size_mib: float,
    modes: list[str],
    repeats: int,
    num_files: int,
    tail_s: float = _DRAIN_S,
) -> _Phase:
    out, scratch = _phase_dirs(work_dir, "ckpt")
    config = {
        "out": str(out),
        "scratch": str(scratch),
        "modes": modes,
        "repeats": repeats,
        "size_mib": size_mib,
        "num_files": num_files,
        "tail_s": tail_s,
    }

    def read() -> dict[str, Any]:
        rank0 = json.loads((out / "ckpt_rank0.json").read_text(encoding="utf-8"))["samples"]
        result: dict[str, Any] = {}
        for mode in modes:
            result[mode] = _harness.median(rank0[mode])
            result[f"{mode}_samples"] = rank0[mode]
        return result

    return _Phase(_train_checkpoint_reports, config, read)


def _child_checkpoint_report(
    work_dir: Path,
    *,
    size_mib: float,
    modes: list[str],
    repeats: int,
    num_files: int,
    num_workers: int,
) -> dict[str, Any]:
    phase = _checkpoint_phase(
        work_dir, size_mib=size_mib, modes=modes, repeats=repeats, num_files=num_files
    )
    _init_ray(num_workers)
    _fit(phase.train, phase.config, num_workers=num_workers, storage=work_dir / "storage",
         name="checkpoint-report")
    return phase.read()


def _train_recovery(config: dict[str, Any]) -> None:
    import ray.train

    rank = ray.train.get_context().get_world_rank()
    out = Path(config["out"])
    start = 0
    marker = out / "crashed"
    # Only the restarted attempt restores: in the shared fit of the quick session, the
    # first attempt sees the checkpoints of the phases before this one.
    checkpoint = ray.train.get_checkpoint() if marker.exists() else None
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            restored = json.loads(Path(directory, "state.json").read_text(encoding="utf-8"))
        start = int(restored["step"]) + 1
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


def _recovery_phase(work_dir: Path, *, step_s: float, crash_after_report: int) -> _Phase:
    """Steps with a SYNC checkpoint each, a crash of rank 0; must be the fit's last phase."""
    out, scratch = _phase_dirs(work_dir, "recovery")
    config = {
        "out": str(out),
        "scratch": str(scratch),
        "step_s": step_s,
        "crash_after_report": crash_after_report,
    }

    def read() -> dict[str, Any]:
        crash = json.loads((out / "crash.json").read_text(encoding="utf-8"))
        restore = json.loads((out / "restore.json").read_text(encoding="utf-8"))
        last, resumed = int(crash["last_reported_step"]), int(restore["resumed_from_step"])
        return {
            "crash_to_first_step_s": restore["t"] - crash["t"],
            "last_reported_step": last,
            "resumed_from_step": resumed,
            # One checkpoint per step, so steps behind are checkpoints behind.
            "checkpoints_behind": last - resumed,
        }

    return _Phase(_train_recovery, config, read)


def _child_recovery(
    work_dir: Path, *, num_workers: int, step_s: float, crash_after_report: int
) -> dict[str, Any]:
    phase = _recovery_phase(work_dir, step_s=step_s, crash_after_report=crash_after_report)
    _init_ray(num_workers)
    _, fit_s = _fit(phase.train, phase.config, num_workers=num_workers,
                    storage=work_dir / "storage", name="recovery", max_failures=1)
    return {**phase.read(), "fit_total_s": fit_s}


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


def _snapshot_phase(work_dir: Path, *, state_mb: float, repeats: int) -> _Phase:
    out, scratch = _phase_dirs(work_dir, "snapshot")
    config = {"out": str(out), "scratch": str(scratch), "state_mb": state_mb, "repeats": repeats}

    def read() -> dict[str, Any]:
        rank0 = json.loads((out / "snapshot_rank0.json").read_text(encoding="utf-8"))
        totals = [s + r for s, r in zip(rank0["save"], rank0["report"], strict=True)]
        return {
            "blocking_s": _harness.median(totals),
            "save_s": _harness.median(rank0["save"]),
            "report_s": _harness.median(rank0["report"]),
            "repeats": repeats,
        }

    return _Phase(_train_snapshot, config, read)


def _child_snapshot_async_torch_save(
    work_dir: Path, *, state_mb: float, repeats: int, num_workers: int
) -> dict[str, Any]:
    phase = _snapshot_phase(work_dir, state_mb=state_mb, repeats=repeats)
    _init_ray(num_workers)
    _fit(phase.train, phase.config, num_workers=num_workers, storage=work_dir / "storage",
         name="snapshot")
    return phase.read()


# --------------------------------------------------------------------------------------
# The quick session: one Ray session, the within-fit measurements in one fit
# --------------------------------------------------------------------------------------


def _train_phases(config: dict[str, Any]) -> None:
    """Run the phases' train functions one after another, on every rank.

    A restarted attempt (the recovery phase's crash marker exists) runs only the last
    phase, the recovery one, which then restores its checkpoint.
    """
    phases: list[tuple[Callable[[dict[str, Any]], None], dict[str, Any]]] = config["phases"]
    marker = config.get("crash_marker")
    if marker is not None and Path(marker).exists():
        phases = phases[-1:]
    for train, phase_config in phases:
        train(phase_config)


def _child_quick_session(
    work_dir: Path,
    *,
    num_workers: int,
    startup: dict[str, Any] | None = None,
    metric: dict[str, Any] | None = None,
    checkpoint: dict[str, Any] | None = None,
    snapshot: dict[str, Any] | None = None,
    recovery: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The quick reference in one Ray session; a result per measurement asked for.

    Why this does not bias the figures:

    * ``startup`` (``fit()`` to the first line, and ``ray.init``) is the session's first
      fit, so it still measures a fresh session: Ray Train creates detached singleton
      actors (its state actor, Ray Data's autoscaling coordinator) in the first fit and
      reuses them in later ones, so only a first fit pays for them. The goodput job, whose
      wall time includes its fit's start, is therefore not part of this session.
    * The other figures are times *inside* a fit (a ``report()`` call; a crash to the
      restarted attempt's restore), so they run as phases of one fit, in this order:
      metric-only reports (the first thing in the fit, as on their own), checkpoint
      reports, ``torch.save`` + ASYNC report, the crash and restore (last, since it
      restarts the fit; the restarted attempt runs only it). Each timed checkpoint report
      still follows a drain of the report queue and of any ASYNC upload (``_DRAIN_S``), and
      the snapshot phase still waits for its upload to finish before the crash phase
      starts, so no phase runs beside another's background work.
    * The metric reports at the fast poll interval need a fit with that interval (it is
      read at ``fit()``): the start-up fit, right after its first line. A faster poll can
      only make Ray's start-up faster, never slower, so this costs Cairn's ratio, if
      anything, and saves a fit.

    ``result.json`` is rewritten after each fit with what is known so far, and the
    measurements of a fit that raised are listed in ``errors`` with the exception; the
    parent takes what is there.
    """
    result: dict[str, Any] = {}
    errors: dict[str, str] = {}
    storage = work_dir / "storage"

    def save() -> None:
        _write_json(work_dir / "result.json", {**result, "errors": errors})

    def failed(names: Sequence[str], exc: BaseException) -> None:
        logging.getLogger(__name__).exception("quick session: %s failed", ", ".join(names))
        message = f"{type(exc).__name__}: {exc}".splitlines()[0]
        errors.update({name: message for name in names})

    ray_init_s = _init_ray(num_workers)
    fast: _Phase | None = None
    if startup is not None and metric is not None and int(metric["fast_poll_num_reports"]) > 0:
        fast = _metric_phase(work_dir, "fast_poll", int(metric["fast_poll_num_reports"]))
    if startup is not None:
        _set_poll_interval(None if fast is None else float(metric["fast_poll_interval_s"]))
        try:
            result["startup"] = _fit_to_first_line(
                work_dir, num_workers=num_workers, trainer=startup["trainer"], then=fast
            )
            result["startup"]["ray_init_s"] = ray_init_s
        except Exception as exc:
            failed(["startup"], exc)
            fast = None  # the fast-poll reports get a fit of their own below
        save()
    _set_poll_interval(None)

    phases: dict[str, _Phase] = {}
    if metric is not None:
        phases["metric"] = _metric_phase(work_dir, "default", int(metric["num_reports"]))
    if checkpoint is not None:
        # The snapshot phase drains before its first timed report: no tail needed then.
        tail_s = 0.0 if snapshot is not None else _DRAIN_S
        phases["checkpoint"] = _checkpoint_phase(work_dir, **checkpoint, tail_s=tail_s)
    if snapshot is not None:
        phases["snapshot"] = _snapshot_phase(work_dir, **snapshot)
    if recovery is not None:
        phases["recovery"] = _recovery_phase(work_dir, **recovery)
    if phases:
        config: dict[str, Any] = {
            "phases": [(phase.train, phase.config) for phase in phases.values()]
        }
        if recovery is not None:
            config["crash_marker"] = str(Path(phases["recovery"].config["out"], "crashed"))
        try:
            _, fit_s = _fit(_train_phases, config, num_workers=num_workers, storage=storage,
                            name="phases", max_failures=1 if recovery is not None else 0)
            for name, phase in phases.items():
                result[name] = phase.read()
            if recovery is not None:
                result["recovery"]["fit_total_s"] = fit_s
        except Exception as exc:
            failed(list(phases), exc)
        save()

    if metric is not None and "metric" in result:
        result["metric"]["fast_poll_interval_s"] = metric["fast_poll_interval_s"]
        try:
            if fast is not None:
                result["metric"].update(
                    {f"fast_poll_{key}": value for key, value in fast.read().items()})
            elif int(metric["fast_poll_num_reports"]) > 0:
                result["metric"].update(_fast_poll_fit(
                    work_dir, num_workers=num_workers,
                    num_reports=int(metric["fast_poll_num_reports"]),
                    interval=float(metric["fast_poll_interval_s"])))
            else:
                result["metric"].update(_no_fast_poll())
        except Exception as exc:
            del result["metric"]
            failed(["metric"], exc)
        save()
    return {**result, "errors": errors}


_CHILDREN: dict[str, Callable[..., dict[str, Any]]] = {
    "metric_report_latency": _child_metric_report_latency,
    "fit_to_first_line": _child_fit_to_first_line,
    "checkpoint_report": _child_checkpoint_report,
    "recovery": _child_recovery,
    "goodput": _child_goodput,
    "snapshot_async_torch_save": _child_snapshot_async_torch_save,
    "quick_session": _child_quick_session,
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
