"""How long an in-memory snapshot of a 500 MB state blocks the training loop.

Usage::

    python bench/snapshot.py [--quick] [--no-ray]

One run of two local Cairn workers (``cairn.Trainer``, local storage in a temporary
directory). Rank 0 holds a state dict of float32 tensors of 25 MB each, 500 MB in all
(Ray's reference state, ``_ray_children._train_snapshot``); the other rank reports
metrics only, in step. Rank 0 times (``time.perf_counter`` around the call), in every
round, after the previous checkpoint has committed and ``os.sync()``:

1. **state-dict copy**: ``{k: v.clone() for k, v in state.items()}``, the plain copy
   a training loop would make to snapshot (target: ``report_snapshot`` within 2x of it);
2. **torch.save** of the state to a file on local disk;
3. **report_snapshot** (``cairn.torch.report_snapshot(metrics, state)``): the blocking
   part (copy into reused CPU buffers, hand-off to the upload thread), then the time to
   its commit (serialization, checksummed upload, manifest);
4. **torch.save + ASYNC report()**: what the Ray reference does, with Cairn's ``report``.

One untimed round comes first; its ``report_snapshot`` (buffers allocated on first use)
is reported on its own as the first call. The order of (1) and (3) alternates between
rounds. Median of 5 rounds (2 with ``--quick``). Unless ``--no-ray``, Ray Train 2.60's
``torch.save`` + ASYNC ``report()`` of the same state (``_ray_reference``, cached) fills the
reference of rows 4 and of ``report_snapshot`` against Ray. ``run(args)`` returns the rows
for ``bench/run_all.py``.
"""

from __future__ import annotations

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

RAY_REFERENCE_GROUPS = ("snapshot",)
"""The Ray reference groups this module fills its rows from (``run_all`` prefetches them)."""

STATE_MB = 500.0
TENSOR_MB = 25.0
BENCHMARK = "snapshot"
METRIC_REPORT_SNAPSHOT = "report_snapshot() blocking 500 MB"
METRIC_REPORT_SNAPSHOT_VS_SAVE = "report_snapshot() blocking 500 MB, vs torch.save"
METRIC_REPORT_SNAPSHOT_VS_RAY = "report_snapshot() blocking 500 MB, vs Ray"
METRIC_REPORT_SNAPSHOT_FIRST = "report_snapshot() first call 500 MB (allocates)"
METRIC_REPORT_SNAPSHOT_COMMIT = "report_snapshot() call to commit 500 MB"
TARGET_RATIO = 2.0

logger = logging.getLogger("bench.snapshot")


def make_state(state_mb: float = STATE_MB) -> dict[str, Any]:
    """float32 tensors of 25 MB each, ``state_mb`` MB in all (as Ray's reference)."""
    import torch

    state: dict[str, Any] = {}
    total = int(state_mb * 1e6) // 4
    per_tensor = int(TENSOR_MB * 1e6) // 4
    index = 0
    while total > 0:
        count = min(per_tensor, total)
        state[f"layer_{index}.weight"] = torch.randn(count)
        total -= count
        index += 1
    return state


def _train_snapshot(config: dict[str, Any]) -> dict[str, list[float]]:
    """Rank 0 times each way of snapshotting; every rank makes the same reports."""
    import torch

    from cairn.torch import report_snapshot

    rank = cairn.get_context().get_world_rank()
    state = make_state(float(config["state_mb"])) if rank == 0 else {}
    scratch = Path(config["scratch"])
    samples: dict[str, list[float]] = {}
    warming_up = True

    def record(key: str, seconds: float) -> None:
        if rank == 0:
            samples.setdefault("first_" + key if warming_up else key, []).append(seconds)

    def settle() -> None:
        if rank == 0:
            os.sync()

    def timed_clone() -> None:
        if rank != 0:
            return
        settle()
        started = time.perf_counter()
        copy = {name: tensor.clone() for name, tensor in state.items()}
        record("clone", time.perf_counter() - started)
        del copy

    def timed_torch_save(number: int) -> None:
        if rank != 0:
            return
        path = scratch / f"save_{number}.pt"
        settle()
        started = time.perf_counter()
        torch.save(state, path)
        record("torch_save", time.perf_counter() - started)
        path.unlink()

    def timed_snapshot(number: int) -> None:
        settle()
        started = time.perf_counter()
        handle = report_snapshot({"round": number, "kind": "snapshot"}, state)
        record("snapshot", time.perf_counter() - started)
        handle.wait()
        record("snapshot_commit", time.perf_counter() - started)

    def timed_save_and_report(number: int) -> None:
        checkpoint = None
        settle()
        started = time.perf_counter()
        if rank == 0:
            directory = scratch / f"async_{number}"
            directory.mkdir()
            torch.save(state, directory / "model.pt")
            checkpoint = cairn.Checkpoint.from_directory(str(directory))
        handle = cairn.report({"round": number, "kind": "save+async"}, checkpoint=checkpoint,
                              checkpoint_upload_mode=cairn.CheckpointUploadMode.ASYNC)
        record("save_async_report", time.perf_counter() - started)
        handle.wait()

    for number in range(int(config["repeats"]) + 1):
        warming_up = number == 0
        if number % 2 == 0:
            timed_clone()
            timed_snapshot(number)
        else:
            timed_snapshot(number)
            timed_clone()
        timed_torch_save(number)
        timed_save_and_report(number)
    return samples


def measure(work: Path, repeats: int, state_mb: float = STATE_MB) -> dict[str, list[float]]:
    scratch = work / "scratch"
    scratch.mkdir()
    result = cairn.Trainer(
        _train_snapshot,
        train_loop_config={"scratch": str(scratch), "repeats": repeats, "state_mb": state_mb},
        scaling_config=cairn.ScalingConfig(num_workers=2),
        run_config=cairn.RunConfig(
            name="snapshot",
            storage_path=str(work),
            checkpoint_config=cairn.CheckpointConfig(num_to_keep=1),
        ),
    ).fit()
    samples: dict[str, list[float]] = result.return_value
    return samples


def cairn_rows(args: Any) -> list[Row]:
    repeats = 2 if getattr(args, "quick", False) else 5
    work = Path(tempfile.mkdtemp(prefix="cairn-bench-snapshot-"))
    try:
        samples = measure(work, repeats)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    median = {key: _harness.median(values) for key, values in samples.items()}
    logger.info("snapshot samples: %s", samples)
    snapshot = median["snapshot"]
    ratio = snapshot / median["clone"]
    return [
        Row(benchmark=BENCHMARK, metric=METRIC_REPORT_SNAPSHOT, cairn=snapshot,
            reference=median["clone"], reference_name="state-dict copy (clone), same run",
            note=f"target <= {TARGET_RATIO:g}x: {'met' if ratio <= TARGET_RATIO else 'MISSED'}; "
                 f"median of {repeats}"),
        Row(benchmark=BENCHMARK, metric=METRIC_REPORT_SNAPSHOT_VS_SAVE, cairn=snapshot,
            reference=median["torch_save"], reference_name="torch.save to local disk",
            note="same run"),
        Row(benchmark=BENCHMARK, metric=METRIC_REPORT_SNAPSHOT_FIRST,
            cairn=median["first_snapshot"], reference=median["first_clone"],
            reference_name="first state-dict copy (clone)",
            note="untimed warm-up round: buffers are allocated and first touched"),
        Row(benchmark=BENCHMARK, metric=METRIC_REPORT_SNAPSHOT_COMMIT,
            cairn=median["snapshot_commit"], reference=None, reference_name="",
            note="background: torch.save to a temp dir, checksummed upload, commit"),
        Row(benchmark=BENCHMARK, metric=ray_ref.METRIC_SNAPSHOT,
            cairn=median["save_async_report"], note="Cairn: torch.save + cairn.report(ASYNC)"),
    ]


def run(args: Any = None) -> list[Row]:
    """Cairn's rows, with Ray Train 2.60's figures as references unless ``args.no_ray``."""
    args = args if args is not None else _module.parse_args(__doc__)
    rows = cairn_rows(args)
    reference = _module.references(args, RAY_REFERENCE_GROUPS)
    if reference is None:
        return rows
    ray_rows = [r for r in reference if r.metric == ray_ref.METRIC_SNAPSHOT]
    if ray_rows and ray_rows[0].reference is not None:
        snapshot = next(r for r in rows if r.metric == METRIC_REPORT_SNAPSHOT)
        rows.insert(2, Row(benchmark=BENCHMARK, metric=METRIC_REPORT_SNAPSHOT_VS_RAY,
                           cairn=snapshot.cairn, reference=ray_rows[0].reference,
                           note="Ray: torch.save + ASYNC report()"))
    return _harness.fill_references(rows, reference)


def main(argv: list[str] | None = None) -> int:
    return _module.module_main(__doc__, run, argv)


if __name__ == "__main__":
    sys.exit(main())
