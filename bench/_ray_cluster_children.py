"""The driver side of ``bench/ray_cluster.py``: one library, N runs of the fault job.

    python bench/_ray_cluster_children.py --library {cairn,ray} --repeats N --work-dir DIR

Run by ``bench/ray_cluster.py`` in a process of its own, with ``RAY_ADDRESS`` naming the
3-node ``ray.cluster_utils`` cluster that the parent started, so that Cairn and Ray Train
never share a driver process. It connects with ``ray.init(address=...)`` (timed apart),
then runs ``N`` trainings of two workers one after another: Cairn with
``ScalingConfig(backend="ray", num_workers=2)``, Ray Train 2.60 with the v2
``DataParallelTrainer``, the same train function (it imports the API named in its config,
same function names), ``FailureConfig(max_failures=2)``. What each run leaves is written
as JSON to ``DIR/result.json``.

One run measures the three figures, one after another in one ``fit()``:

* **start-up**: each rank of the first attempt writes ``time.time()`` at the first line
  of the function;
* **worker crash**: a SYNC checkpoint (rank 0, ``state.json`` with the step) every 0.5 s
  step; in the first attempt rank 0 writes the wall time and calls ``os._exit(1)`` right
  after the report of step :data:`CRASH_STEP` returned;
* **node loss**: in the attempt after the crash, every rank writes its Ray node and holds
  right after the report of step :data:`NODE_LOSS_STEP` returned; the parent removes the
  node of a worker and adds one back. Before each run after the first, this process waits
  for the parent's ``go_<run>`` file (the cluster is whole again).

Every rank of the attempt after a fault writes the wall time as soon as it has loaded its
checkpoint, before its first step.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

NUM_WORKERS = 2
STEP_S = 0.5
CRASH_STEP = 3  # the step whose report returns just before the crash
NODE_LOSS_STEP = 6  # ... and just before the node loss, in the attempt after the crash
STEPS_AFTER = 2  # steps after the last fault's step, once restored
FAULTS = (("crash", CRASH_STEP), ("node_loss", NODE_LOSS_STEP))
"""The faults of a run, in the order they happen: attempt ``i`` ends with fault ``i``."""
HOLD_S = 600.0  # a rank that holds for the node loss gives up after this
GO_TIMEOUT_S = 300.0
LIBRARIES = ("cairn", "ray")

logger = logging.getLogger("bench.ray_cluster_children")


def _write_json(path: str | os.PathLike[str], data: Any) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def _read_rank_files(out: Path, tag: str) -> list[dict[str, Any]]:
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(out.glob(f"{tag}_*.json"))]


def _api(config: dict[str, Any]) -> Any:
    """``cairn`` or ``ray.train``: the same names for what the functions below use."""
    return importlib.import_module("cairn" if config["library"] == "cairn" else "ray.train")


def _node_id() -> str:
    import ray

    return str(ray.get_runtime_context().get_node_id())


def _process_start_t() -> float | None:
    """Wall time at which this process started (Linux ``/proc``), else None."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat", encoding="ascii") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


# --------------------------------------------------------------------------------------
# The train function (it runs in the workers on the cluster's nodes)
# --------------------------------------------------------------------------------------


def train_faults(config: dict[str, Any]) -> None:
    """Steps with a SYNC checkpoint each; the faults of :data:`FAULTS`, one an attempt."""
    first_line = time.time()
    api = _api(config)
    rank = api.get_context().get_world_rank()
    out = Path(config["out"])
    # Decided once, at the start: another rank's marker must not change this attempt.
    happened = [name for name, _ in FAULTS if (out / f"{name}.happened").exists()]
    pending = FAULTS[len(happened)] if len(happened) < len(FAULTS) else None
    if not happened:
        _write_json(out / f"first_{rank}.json", {"t": first_line})
    start = 0
    checkpoint = api.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            restored = json.loads(Path(directory, "state.json").read_text(encoding="utf-8"))
        start = int(restored["step"]) + 1
    if happened:
        # Where the time went on this rank: its process's start, the train function's
        # first line, the checkpoint loaded (now), its priority.
        _write_json(out / f"restore_{happened[-1]}_{rank}.json",
                    {"t": time.time(), "resumed_from_step": start - 1, "node": _node_id(),
                     "first_line_t": first_line, "process_start_t": _process_start_t(),
                     "pid": os.getpid(), "niceness": os.nice(0)})
    for step in range(start, FAULTS[-1][1] + 1 + STEPS_AFTER):
        time.sleep(STEP_S)
        scratch = None
        checkpoint = None
        if rank == 0:
            scratch = tempfile.mkdtemp(dir=config["scratch"])
            Path(scratch, "state.json").write_text(json.dumps({"step": step}), encoding="utf-8")
            checkpoint = api.Checkpoint.from_directory(scratch)
        api.report({"step": step}, checkpoint=checkpoint)  # SYNC, the default on both sides
        if pending is not None and step == pending[1]:
            if pending[0] == "crash" and rank == 0:
                _write_json(out / "crash.json", {"t": time.time(), "last_reported_step": step})
                (out / "crash.happened").touch()
                os._exit(1)
            if pending[0] == "node_loss":
                (out / "node_loss.happened").touch()
                _write_json(out / f"holding_{rank}.json",
                            {"t": time.time(), "step": step, "node": _node_id()})
                # Until the node is removed; the ranks left then go on training, as a
                # real job's would, and meet the loss at their next report (bounded).
                if not _wait_for_file(out / "node_removed", HOLD_S):
                    raise RuntimeError(f"rank {rank}: the node was not removed in {HOLD_S:g} s")
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _wait_for_file(path: Path, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


# --------------------------------------------------------------------------------------
# One training run of either library
# --------------------------------------------------------------------------------------


def _fit(library: str, train_fn: Any, config: dict[str, Any], *, storage: Path, name: str,
         max_failures: int, failure: dict[str, bool] | None = None,
         ) -> tuple[float, float, str | None]:
    """(wall time at the ``fit()`` call, seconds it took, Cairn's run path or None)."""
    config = {**config, "library": library}
    if library == "cairn":
        import cairn

        trainer: Any = cairn.Trainer(
            train_fn,
            train_loop_config=config,
            scaling_config=cairn.ScalingConfig(num_workers=NUM_WORKERS, backend="ray"),
            run_config=cairn.RunConfig(
                name=name,
                storage_path=str(storage),
                failure_config=cairn.FailureConfig(max_failures=max_failures,
                                                   **(failure or {})),
            ),
        )
    else:
        import ray.train
        from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

        trainer = DataParallelTrainer(
            train_fn,
            train_loop_config=config,
            scaling_config=ray.train.ScalingConfig(num_workers=NUM_WORKERS),
            run_config=ray.train.RunConfig(
                name=name,
                storage_path=str(storage),
                failure_config=ray.train.FailureConfig(max_failures=max_failures),
            ),
        )
    fit_wall = time.time()
    started = time.perf_counter()
    result = trainer.fit()
    path = getattr(result, "path", None) if library == "cairn" else None
    return fit_wall, time.perf_counter() - started, path


class _BackendTimes(logging.Handler):
    """Wall times of Cairn's Ray backend's phase lines (placement group ready, actors
    started, a failed rank's actor replaced), for the benchmark's breakdown of a restart."""

    PHASES = {"placed": "placement group of", "actors": "worker actors started in",
              "replaced": "Replaced the Ray workers of ranks"}

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.times: dict[str, list[float]] = {kind: [] for kind in self.PHASES}

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        for kind, marker in self.PHASES.items():
            if marker in message:
                self.times[kind].append(record.created)


def _wait_for(path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout_s:g} s")
        time.sleep(0.05)


def run_once(library: str, run_dir: Path, index: int,
             failure: dict[str, bool] | None = None) -> dict[str, Any]:
    """The start-up and both faults of one run; times are wall times (``time.time()``)."""
    out, scratch, storage = run_dir / "out", run_dir / "scratch", run_dir / "storage"
    for folder in (out, scratch, storage):
        folder.mkdir(parents=True, exist_ok=True)
    config = {"out": str(out), "scratch": str(scratch)}
    fit_wall, fit_s, run_path = _fit(library, train_faults, config, storage=storage,
                                     name=f"faults-{index}", max_failures=len(FAULTS),
                                     failure=failure)
    starts = [r["t"] - fit_wall for r in _read_rank_files(out, "first")]
    if len(starts) != NUM_WORKERS:
        raise RuntimeError(f"{len(starts)} of {NUM_WORKERS} ranks wrote their first line")
    result: dict[str, Any] = {"fit_to_first_line_s": max(starts), "first_rank_s": min(starts),
                              "fit_s": fit_s, "run_path": run_path}
    for attempt, (fault, step) in enumerate(FAULTS, start=1):
        restores = _read_rank_files(out, f"restore_{fault}")
        if len(restores) != NUM_WORKERS:
            raise RuntimeError(f"{len(restores)} of {NUM_WORKERS} ranks restored after the "
                               f"{fault.replace('_', ' ')}")
        result[fault] = {
            "attempt": attempt,
            "restore_t": max(r["t"] for r in restores),
            "restore_first_rank_t": min(r["t"] for r in restores),
            "resumed_from_step": min(int(r["resumed_from_step"]) for r in restores),
            "last_reported_step": step,
            "restored_nodes": sorted({r["node"] for r in restores}),
            "ranks": restores,
        }
    crash = json.loads((out / "crash.json").read_text(encoding="utf-8"))
    result["crash"]["fault_t"] = float(crash["t"])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="One side of bench/ray_cluster.py.")
    parser.add_argument("--library", required=True, choices=LIBRARIES)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--work-dir", required=True)
    parser.add_argument("--warm-standby", action="store_true",
                        help="Cairn with FailureConfig(warm_standby=True)")
    parser.add_argument("--keep-survivors", action="store_true",
                        help="Cairn with FailureConfig(keep_survivors=True)")
    args = parser.parse_args(argv)
    failure = {"warm_standby": args.warm_standby, "keep_survivors": args.keep_survivors}
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("cairn").setLevel(logging.WARNING)
    backend_times = _BackendTimes()
    if args.library == "cairn":
        backend_logger = logging.getLogger("cairn._src.backends.ray")
        backend_logger.setLevel(logging.DEBUG)
        backend_logger.addHandler(backend_times)
        backend_logger.propagate = False
    work = Path(args.work_dir)
    import ray

    started = time.perf_counter()
    ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False,
             logging_level=logging.WARNING)
    result: dict[str, Any] = {"connect_s": time.perf_counter() - started, "runs": []}
    try:
        for index in range(args.repeats):
            if index > 0:
                _wait_for(work / f"go_{index}", GO_TIMEOUT_S)
            logger.info("%s run %d of %d", args.library, index + 1, args.repeats)
            run = run_once(args.library, work / f"run{index}", index, failure)
            run["backend_times"] = {k: list(v) for k, v in backend_times.times.items()}
            for times in backend_times.times.values():
                times.clear()
            result["runs"].append(run)
            _write_json(work / "result.json", result)
    finally:
        ray.shutdown()
    _write_json(work / "result.json", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
