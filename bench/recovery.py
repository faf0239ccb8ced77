"""Worker crash to the first step after restore, and which checkpoint the run resumed from.

Usage::

    python bench/recovery.py [--quick] [--no-ray]

The same run as the Ray reference (``_ray_reference.ray_recovery``): two workers, a step
of 0.5 s, a SYNC checkpoint from rank 0 (``state.json`` with the step) at every step. On
the first attempt rank 0 writes the wall time and calls ``os._exit(1)`` right after the
report of step 3 returned; ``FailureConfig(max_failures=1)``. The restarted attempt writes
the wall time as soon as it has loaded its checkpoint (before its first step).

Figures, median of 3 runs (1 with ``--quick``): crash to first step after restore (target:
at most 2 s), and checkpoints behind, the last SYNC report against the checkpoint resumed
from (target: 0, worst run shown). The note breaks the recovery down with the run's event
log: crash to failure handled (exit noticed, other workers stopped, index saved), to the
new attempt, to every worker connected, to the restored first step.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
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

RAY_REFERENCE_GROUPS = ("recovery",)
"""The Ray reference groups this module fills its rows from (``run_all`` prefetches them)."""

STEP_S = 0.5
CRASH_AFTER_REPORT = 3  # the step whose report returns just before the crash
NUM_WORKERS = 2

logger = logging.getLogger("bench.recovery")


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, path)


def _train_recovery(config: dict[str, Any]) -> None:
    rank = cairn.get_context().get_world_rank()
    out = Path(config["out"])
    start = 0
    checkpoint = cairn.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            restored = json.loads(Path(directory, "state.json").read_text(encoding="utf-8"))
        start = int(restored["step"]) + 1
    marker = out / "crashed"
    if rank == 0 and marker.exists():
        _write_json(out / "restore.json", {"t": time.time(), "resumed_from_step": start - 1})
    crash_step = int(config["crash_after_report"])
    for step in range(start, crash_step + 3):
        time.sleep(float(config["step_s"]))
        scratch = None
        checkpoint = None
        if rank == 0:
            scratch = tempfile.mkdtemp(dir=config["scratch"])
            Path(scratch, "state.json").write_text(json.dumps({"step": step}), encoding="utf-8")
            checkpoint = cairn.Checkpoint.from_directory(scratch)
        cairn.report({"step": step}, checkpoint=checkpoint)  # SYNC, the default
        if rank == 0 and step == crash_step and not marker.exists():
            _write_json(out / "crash.json", {"t": time.time(), "last_reported_step": step})
            marker.touch()
            os._exit(1)
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def measure_once(work: Path, name: str) -> dict[str, Any]:
    out, scratch = work / "out", work / "scratch"
    out.mkdir(parents=True)
    scratch.mkdir()
    trainer = cairn.Trainer(
        _train_recovery,
        train_loop_config={
            "out": str(out),
            "scratch": str(scratch),
            "step_s": STEP_S,
            "crash_after_report": CRASH_AFTER_REPORT,
        },
        scaling_config=cairn.ScalingConfig(num_workers=NUM_WORKERS),
        run_config=cairn.RunConfig(
            name=name,
            storage_path=str(work),
            failure_config=cairn.FailureConfig(max_failures=1),
        ),
    )
    started = time.perf_counter()
    result = trainer.fit()
    fit_s = time.perf_counter() - started
    crash = json.loads((out / "crash.json").read_text(encoding="utf-8"))
    restore = json.loads((out / "restore.json").read_text(encoding="utf-8"))
    last, resumed = int(crash["last_reported_step"]), int(restore["resumed_from_step"])
    events = _harness.read_run_events(result.path)

    def first(kind: str, attempt: int | None = None) -> float | None:
        for event in events:
            if event.get("type") == kind and (attempt is None or event.get("attempt") == attempt):
                return float(event["t"])
        return None

    failed_at = first("failure")
    restarted_at = first("attempt_start", 1)
    ready_at = first("workers_ready", 1)
    crash_t, restore_t = float(crash["t"]), float(restore["t"])
    phases = {
        "failure_handled": (failed_at - crash_t) if failed_at else None,
        "new_attempt": (restarted_at - failed_at) if restarted_at and failed_at else None,
        "workers_ready": (ready_at - restarted_at) if ready_at and restarted_at else None,
        "restored": (restore_t - ready_at) if ready_at else None,
    }
    return {
        "crash_to_first_step_s": restore_t - crash_t,
        "last_reported_step": last,
        "resumed_from_step": resumed,
        "checkpoints_behind": last - resumed,
        "fit_s": fit_s,
        "phases": phases,
    }


def _format_phases(runs: list[dict[str, Any]]) -> str:
    labels = {
        "failure_handled": "failure handled",
        "new_attempt": "new attempt",
        "workers_ready": "workers connected",
        "restored": "restored",
    }
    parts = []
    for key, label in labels.items():
        values = [r["phases"][key] for r in runs if r["phases"][key] is not None]
        if values:
            parts.append(f"{label} +{_harness.median(values):.2f}")
    return "crash -> " + ", ".join(parts) + " s (medians)"


def cairn_rows(args: Any) -> list[Row]:
    repeats = 1 if getattr(args, "quick", False) else 3
    runs = []
    with _harness.quiet_logger("cairn"), tempfile.TemporaryDirectory(
        prefix="cairn-bench-recovery-"
    ) as tmp:
        for repeat in range(repeats):
            logger.info("recovery run %d of %d", repeat + 1, repeats)
            runs.append(measure_once(Path(tmp, f"run{repeat}"), f"recovery{repeat}"))
    times = [r["crash_to_first_step_s"] for r in runs]
    behind = max(int(r["checkpoints_behind"]) for r in runs)
    worst = max(runs, key=lambda r: r["checkpoints_behind"])
    return [
        Row(
            benchmark="recovery",
            metric=ray_ref.METRIC_RECOVERY,
            cairn=_harness.median(times),
            note=f"target <= 2 s; median of {repeats} "
            f"({', '.join(f'{t:.2f}' for t in times)} s); {_format_phases(runs)}",
        ),
        Row(
            benchmark="recovery",
            metric=ray_ref.METRIC_RECOVERY_BEHIND,
            cairn=behind,
            unit="ckpts",
            note=f"target 0; worst of {repeats}: last reported step "
            f"{worst['last_reported_step']}, resumed from step {worst['resumed_from_step']}",
        ),
    ]


def run(args: Any = None) -> list[Row]:
    """Cairn's rows, with Ray Train 2.60's figures as references unless ``args.no_ray``."""
    args = args if args is not None else _module.parse_args(__doc__)
    return _module.with_references(cairn_rows(args), args, RAY_REFERENCE_GROUPS)


def main(argv: list[str] | None = None) -> int:
    return _module.module_main(__doc__, run, argv)


if __name__ == "__main__":
    sys.exit(main())
