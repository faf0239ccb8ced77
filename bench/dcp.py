"""Cairn's snapshots beside PyTorch Distributed Checkpoint (DCP), side by side in one run.

Usage::

    python bench/dcp.py [--quick] [--size-mb N] [--rounds N] [--fsync-cost]

One ``cairn.torch.TorchTrainer`` run of two workers (gloo, CPUs, local storage in a
temporary directory). Each rank trains the same MLP wrapped by ``prepare_model`` (DDP;
8 square layers, batch 16, torch on one thread) with Adam; its parameters and Adam's two
moments are ``--size-mb`` MB per rank (500 by default, 32 with ``--quick``). Every side
saves that state on both ranks:

* **Cairn**: ``cairn.torch.report_snapshot(metrics, model=..., optimizer=...)``;
  committed when its ``ReportHandle.wait()`` returns; restored by ``load_training_state``;
* **DCP save**: ``dcp.save`` (blocking);
* **DCP async**: ``dcp.async_save`` with its defaults (a thread, a new stager per call);
* **DCP async cached**: ``async_save(async_stager=DefaultStager(StagingOptions(False,
  False, False, False)))`` kept across calls, which caches its CPU copies (pinned memory
  and async staging need an accelerator);
* **DCP async process + shm**: ``async_save(async_checkpointer_type=
  AsyncCheckpointerType.PROCESS)`` with a kept ``DefaultStager`` staging into shared
  memory; DCP's checkpoint process per rank starts at the first call (in the warm-up);
* **sharded route**: what a user with FSDP does (``examples/torch_dcp_async.py``): the
  cached ``async_save`` through ``storage_writer=cairn.torch.FileSystemWriter(dir)`` (DCP's
  writer, checksumming each file as it writes it), then at once
  ``cairn.report(checkpoint=Checkpoint(dir), checkpoint_upload_mode=ASYNC,
  checkpoint_upload_fn=fn)``, where ``fn`` runs on Cairn's upload thread, waits for DCP's
  future and returns ``writer.checkpoint()``: Cairn registers the directory by reference
  (no copy, its files not read again) the moment DCP has written it; committed at the handle's
  ``wait()``; restored by ``dcp.load`` from the checkpoint's ``as_directory()``. Its
  reference is the cached ``async_save`` alone (target: <= 1.1x call to committed). Its
  blocking figure is the ``async_save`` call plus the ``report()``;
* **sharded route, NO_UPLOAD at a step boundary** (the example's ``--mode no-upload``):
  the same save, then, every rank's future done, ``report(checkpoint=writer.checkpoint(),
  checkpoint_upload_mode=NO_UPLOAD)``; with steps running that ``report()`` comes at the
  first step boundary after the futures are done, as a training loop would, so its commit
  waits for a step. (A ``report()`` from the future's done-callback would not: but the
  n-th ``report()`` of every rank is report n, so reports from two threads would number
  differently on two ranks.)

DCP saves go through a gloo group of their own and DCP's default ``FileSystemWriter``
(``sync_files=True``; the sharded routes: Cairn's, which is DCP's plus the checksums);
the state is ``get_state_dict(model, optimizer)`` (DDP replicas: DCP's planner writes
each tensor once, split over the ranks). One untimed warm-up save
of every side, then ``--rounds`` rounds (3; 1 with ``--quick``) of every side in turn, the
order reversed every other round. Per side and round: a save with the loop idle (call,
commit, bytes, fsyncs), a restore of it into a fresh model and Adam, then ``idle_steps``
steps with nothing in flight and a save with steps running until every rank saw it
committed. ``os.sync()`` before every phase. Figures are medians over rounds (steps: all
samples pooled), on rank 0 (``time.perf_counter``):

* blocking: the save call until it returns (the loop may then change the state);
* call to committed, loop idle / steps running (``dcp.save``: the call, no steps run);
* bytes written per checkpoint: ``write_bytes`` of ``/proc/<pid>/io`` (counted when pages
  are dirtied, so temporary files count even if deleted before writeback) of both workers,
  their live children (DCP's checkpoint process; reaped children are in their parent's
  count) and the driver process (Cairn commits there), over the idle save;
* fsync calls per checkpoint: ``os.fsync``/``os.fdatasync`` patched to count in both
  workers (DCP's checkpoint process is not counted: its ``FileSystemWriter`` is the same);
  Cairn's driver adds 4 (manifest and index, each with its directory), not counted;
* restore: fresh model (``to_empty``) and Adam, load call to return, both ranks;
* step median and p90 during the background phase over the idle steps' (a ratio: 1x
  means no slowdown);
* the sharded routes' own part: from DCP's future done (its done-callback) to the commit
  seen on rank 0, beside the cached ``async_save`` alone; the whole route's ratio also
  carries the disk's swings from one save to the next, this one does not.

The table's rows put Cairn beside the best DCP variant for each figure (named in
``Against``; for call to committed, the best ``async_save`` variant, the reference of
issue 30's targets: <= 1.2x idle, <= 3x with steps running, and Cairn's step p90
busy/idle <= 1.05); the note lists every variant. ``--fsync-cost`` then runs Cairn alone
with ``RunConfig(storage_fsync=False)`` and adds its call to committed beside the
durable one's. ``run(args)`` returns the rows for
``bench/run_all.py``. DCP's checkpoint process logs its requests at INFO to stderr (its
own handler, set up in that process): those lines are DCP's, not the benchmark's.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
for _path in (str(BENCH_DIR.parent), str(BENCH_DIR)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import _dcp_worker as worker  # noqa: E402
import _harness  # noqa: E402

import cairn  # noqa: E402

Row = _harness.Row

BENCHMARK = "dcp"
COMMIT_TARGET = 1.1
# Issue 30's targets for report_snapshot against the best DCP async_save of the same run:
# call to committed with the loop idle, and with steps running; and the step p90 during
# the background phase over the idle one (Cairn's own ratio).
TARGETS = {"commit": 1.2, "busy_commit": 3.0}
STEP_P90_TARGET = 1.05
LABELS = {
    worker.DCP_SAVE: "DCP save",
    worker.DCP_ASYNC: "DCP async_save (default)",
    worker.DCP_CACHED: "DCP async_save (cached stager)",
    worker.DCP_PROCESS: "DCP async_save (process + shm)",
}
DCP_SIDES = tuple(LABELS)
ASYNC_SIDES = tuple(side for side in DCP_SIDES if side != worker.DCP_SAVE)
SHORT = {worker.DCP_SAVE: "save", worker.DCP_ASYNC: "async", worker.DCP_CACHED: "cached",
         worker.DCP_PROCESS: "process+shm"}

logger = logging.getLogger("bench.dcp")


@dataclass(frozen=True)
class Settings:
    size_mb: float
    rounds: int
    idle_steps: int


FULL = Settings(size_mb=500.0, rounds=3, idle_steps=10)
QUICK = Settings(size_mb=32.0, rounds=1, idle_steps=10)


def settings_for(args: Any) -> Settings:
    base = QUICK if getattr(args, "quick", False) else FULL
    size = getattr(args, "size_mb", None)
    rounds = getattr(args, "rounds", None)
    return Settings(size_mb=float(size) if size is not None else base.size_mb,
                    rounds=int(rounds) if rounds is not None else base.rounds,
                    idle_steps=base.idle_steps)


def measure(work: Path, settings: Settings,
            sides: Sequence[str] = worker.SIDES, *, fsync: bool = True) -> dict[str, Any]:
    """Run the comparison; rank 0's samples (``_dcp_worker.train_dcp_comparison``).
    ``fsync``: the run's ``RunConfig.storage_fsync``."""
    from cairn.torch import TorchTrainer

    dcp_root = work / "dcp"
    dcp_root.mkdir(parents=True)
    config = {"state_mb": settings.size_mb, "rounds": settings.rounds,
              "idle_steps": settings.idle_steps, "dcp_root": str(dcp_root),
              "driver_pid": os.getpid(), "sides": list(sides)}
    result = TorchTrainer(
        worker.train_dcp_comparison,
        train_loop_config=config,
        scaling_config=cairn.ScalingConfig(num_workers=2),
        run_config=cairn.RunConfig(
            name="dcp", storage_path=str(work / "storage"), progress=0, storage_fsync=fsync,
            checkpoint_config=cairn.CheckpointConfig(num_to_keep=1),
        ),
    ).fit()
    samples: dict[str, Any] = result.return_value
    return samples


# --------------------------------------------------------------------------------------
# Rows (pure: from the samples)
# --------------------------------------------------------------------------------------


def figures(samples: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per side: medians of its samples, and its busy step median / p90 over the idle's."""
    idle = samples["idle_steps"]
    idle_median, idle_p90 = _harness.median(idle), _harness.percentile(idle, 90)
    result: dict[str, dict[str, float]] = {}
    for side, values in samples["samples"].items():
        if not values:
            continue
        figure = {key: _harness.median(values[key])
                  for key in ("call", "commit", "write_bytes", "cancelled_bytes", "fsync",
                              "restore")}
        if values.get("after_save"):
            figure["after_save"] = _harness.median(values["after_save"])
            figure["saved"] = _harness.median(values["saved"])
        if side == worker.DCP_SAVE:
            figure["busy_commit"] = figure["commit"]
        else:
            figure["busy_commit"] = _harness.median(values["busy_commit"])
            steps = [s for phase in values["busy_steps"] for s in phase]
            figure["step_median_ratio"] = _harness.median(steps) / idle_median
            figure["step_p90_ratio"] = _harness.percentile(steps, 90) / idle_p90
            figure["busy_step_count"] = float(len(steps))
        if side == worker.DCP_PROCESS:
            # Its writes, and fsyncs, happen in DCP's checkpoint process: not counted.
            del figure["fsync"]
        result[side] = figure
    return result


def best(per_side: dict[str, dict[str, float]], key: str) -> tuple[str, float] | None:
    """The DCP variant with the lowest ``key`` (every figure here is lower-is-better);
    for the commit figures, of the ``async_save`` variants (the targets' reference)."""
    sides = ASYNC_SIDES if key in TARGETS else DCP_SIDES
    candidates = [(side, per_side[side][key]) for side in sides
                  if side in per_side and key in per_side[side]]
    return min(candidates, key=lambda item: item[1]) if candidates else None


def variants_note(per_side: dict[str, dict[str, float]], key: str, scale: float = 1.0) -> str:
    return "DCP: " + ", ".join(
        f"{SHORT[side]} {_harness.format_value(per_side[side][key] * scale)}"
        for side in DCP_SIDES if side in per_side and key in per_side[side])


FIGURES = (
    # key, metric, unit, scale
    ("call", "blocking (call until the loop may change the state)", "s", 1.0),
    ("commit", "call to committed, loop idle", "s", 1.0),
    ("busy_commit", "call to committed, steps running", "s", 1.0),
    ("write_bytes", "bytes written per checkpoint", "MB", 1e-6),
    ("fsync", "fsync calls per checkpoint", "calls", 1.0),
    ("restore", "restore into a fresh model + Adam", "s", 1.0),
    ("step_median_ratio", "step median during the background phase, busy/idle", "x", 1.0),
    ("step_p90_ratio", "step p90 during the background phase, busy/idle", "x", 1.0),
)


def rows_from(samples: dict[str, Any], settings: Settings) -> list[Row]:
    per_side = figures(samples)
    state_mb = samples["state_bytes"] / 1e6
    size = f"{state_mb:.0f} MB"
    common = (f"{settings.rounds} round(s), 2 gloo ranks, {size} model + Adam per rank "
              f"(width {samples['width']})")
    rows: list[Row] = []
    cairn_side = per_side.get(worker.CAIRN)
    for key, metric, unit, scale in FIGURES:
        if cairn_side is None or key not in cairn_side:
            continue
        top = best(per_side, key)
        note = variants_note(per_side, key, scale)
        if key == "write_bytes":
            note += (f"; cancelled before writeback: Cairn "
                     f"{cairn_side['cancelled_bytes'] * scale:.0f} MB")
        if key == "fsync":
            note += ("; counted in both workers (process + shm: in DCP's checkpoint process, "
                     "not counted); Cairn's workers fsync each file and its directories up "
                     "to the run's, its driver then 4 more (manifest and index, each with "
                     "its directory); DCP FileSystemWriter(sync_files=True) syncs every "
                     "file and .metadata")
        if key.startswith("step_"):
            note += (f"; {int(cairn_side['busy_step_count'])} busy steps (Cairn), "
                     f"{len(samples['idle_steps'])} idle")
        if key == "call":
            note += "; " + common
        if key in TARGETS and top is not None and top[1]:
            verdict = "met" if cairn_side[key] / top[1] <= TARGETS[key] else "MISSED"
            note = f"target <= {TARGETS[key]:g}x: {verdict}; {note}"
        if key == "step_p90_ratio":
            verdict = "met" if cairn_side[key] <= STEP_P90_TARGET else "MISSED"
            note = f"target <= {STEP_P90_TARGET:g} (Cairn's): {verdict}; {note}"
        rows.append(Row(benchmark=BENCHMARK, metric=f"{metric}, {size}",
                        cairn=cairn_side[key] * scale,
                        reference=None if top is None else top[1] * scale,
                        reference_name="" if top is None else f"best: {LABELS[top[0]]}",
                        unit=unit, note=note))
    rows += sharded_rows(samples, per_side, size)
    return rows


SHARDED_ROUTES = {
    worker.SHARDED_FN: ("sharded route", "async_save, then at once report(ASYNC, "
                        "checkpoint_upload_fn=...) whose function, on Cairn's upload "
                        "thread, waits for the future and returns the directory"),
    worker.SHARDED: ("sharded route, NO_UPLOAD at a step boundary",
                     "async_save, then report(NO_UPLOAD) at the first step boundary after "
                     "every rank's future is done"),
}


def rounds(samples: dict[str, Any], side: str, key: str) -> str:
    """``side``'s samples of ``key``, round by round (seconds)."""
    return "/".join(f"{value:.2f}" for value in samples["samples"][side].get(key, []))


def sharded_rows(samples: dict[str, Any], per_side: dict[str, dict[str, float]],
                 size: str) -> list[Row]:
    alone = per_side.get(worker.DCP_CACHED)
    if alone is None:
        return []
    rows: list[Row] = []
    for side, (name, how) in SHARDED_ROUTES.items():
        sharded = per_side.get(side)
        if sharded is None:
            continue
        for key, metric in (("call", "blocking (async_save call)"),
                            ("commit", "call to committed, loop idle"),
                            ("busy_commit", "call to committed, steps running"),
                            ("restore", "restore (as_directory + dcp.load) into a fresh "
                                        "model + Adam"),
                            ("step_p90_ratio", "step p90 during the background phase, "
                                               "busy/idle")):
            unit = "x" if key.startswith("step_") else "s"
            ratio = sharded[key] / alone[key] if alone[key] else None
            note = how
            if "commit" in key and ratio is not None:
                verdict = "met" if ratio <= COMMIT_TARGET else "MISSED"
                note = (f"target <= {COMMIT_TARGET:g}x: {verdict}; per round "
                        f"{rounds(samples, side, key)} against "
                        f"{rounds(samples, worker.DCP_CACHED, key)} alone; {note}")
            rows.append(Row(benchmark=BENCHMARK, metric=f"{name}: {metric}, {size}",
                            cairn=sharded[key], reference=alone[key],
                            reference_name=f"{LABELS[worker.DCP_CACHED]} alone", unit=unit,
                            note=note))
        if "after_save" in sharded and alone["commit"]:
            # What Cairn adds once DCP's future is done, beside the same DCP save alone:
            # the whole route's ratio also carries the disk's swings from save to save.
            part = sharded["after_save"]
            added = (alone["commit"] + part) / alone["commit"]
            verdict = "met" if added <= COMMIT_TARGET else "MISSED"
            rows.append(Row(
                benchmark=BENCHMARK,
                metric=f"{name}: DCP's own part (call to DCP's future done), loop idle, "
                       f"{size}",
                cairn=sharded["saved"], reference=alone["commit"],
                reference_name=f"{LABELS[worker.DCP_CACHED]} alone, call to committed",
                unit="s",
                note=f"the same async_save, with cairn.torch.FileSystemWriter, inside the "
                     f"route; per round {rounds(samples, side, 'saved')} against "
                     f"{rounds(samples, worker.DCP_CACHED, 'commit')} alone; {how}"))
            rows.append(Row(
                benchmark=BENCHMARK,
                metric=f"{name}: Cairn's part (DCP's future done to committed), loop idle, "
                       f"{size}",
                cairn=part, reference=alone["commit"],
                reference_name=f"{LABELS[worker.DCP_CACHED]} alone, call to committed",
                unit="s",
                note=f"async_save alone plus this part: {added:.3g}x of it (target <= "
                     f"{COMMIT_TARGET:g}x: {verdict}); {how}"))
    return rows


# --------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------


def fsync_cost_rows(durable: dict[str, Any], scratch: dict[str, Any]) -> list[Row]:
    """Cairn with ``storage_fsync=True`` (the comparison's run) against a run of Cairn
    alone with ``storage_fsync=False``: what durability costs."""
    on = figures(durable).get(worker.CAIRN)
    off = figures(scratch).get(worker.CAIRN)
    if on is None or off is None:
        return []
    size = f"{durable['state_bytes'] / 1e6:.0f} MB"
    return [Row(benchmark=BENCHMARK, metric=f"fsync cost: {metric}, {size}",
                cairn=on[key], reference=off[key],
                reference_name="Cairn with RunConfig(storage_fsync=False)", unit="s",
                note="Cairn's report_snapshot with fsync (default) against without, "
                     "two runs one after the other")
            for key, metric in (("commit", "call to committed, loop idle"),
                                ("busy_commit", "call to committed, steps running"))]


def cairn_rows(args: Any) -> list[Row]:
    settings = settings_for(args)
    logger.info("dcp: %g MB per rank, %d round(s)", settings.size_mb, settings.rounds)
    work = Path(tempfile.mkdtemp(prefix="cairn-bench-dcp-"))
    scratch: dict[str, Any] | None = None
    try:
        with _harness.quiet_logger("cairn"):
            samples = measure(work / "durable", settings)
            if getattr(args, "fsync_cost", False):
                scratch = measure(work / "scratch", settings, (worker.CAIRN,), fsync=False)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    logger.debug("dcp samples: %s", samples)
    rows = rows_from(samples, settings)
    if scratch is not None:
        rows += fsync_cost_rows(samples, scratch)
    return rows


def run(args: Any = None) -> list[Row]:
    """Cairn beside DCP, measured in the same run (no Ray reference)."""
    args = args if args is not None else parse_args([])
    return cairn_rows(args)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK.size_mb:g} MB, {QUICK.rounds} round")
    parser.add_argument("--size-mb", type=float, default=None,
                        help=f"model + Adam state per rank, MB (default {FULL.size_mb:g})")
    parser.add_argument("--rounds", type=int, default=None,
                        help=f"timed rounds (default {FULL.rounds})")
    parser.add_argument("--fsync-cost", action="store_true",
                        help="then run Cairn alone with RunConfig(storage_fsync=False)")
    parser.add_argument("--no-ray", action="store_true", help="accepted for run_all")
    args = parser.parse_args(argv)
    if args.size_mb is not None and args.size_mb <= 0:
        parser.error(f"--size-mb must be > 0, got {args.size_mb:g}")
    if args.rounds is not None and args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    args.only = None
    args.write_results = False
    return args


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="[bench] %(message)s", stream=sys.stderr)
    rows = run(parse_args(argv))
    _harness.print_table(rows)
    return 1 if any(_harness.is_error_row(row) for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
