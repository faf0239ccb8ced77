"""Cairn's Ray backend beside Ray Train 2.60 on one 3-node Ray cluster, in one run.

Usage::

    python bench/ray_cluster.py [--quick] [--no-ray] [--repeats N] [--warm-standby]
                                [--keep-survivors]

This process starts a ``ray.cluster_utils.Cluster`` on this machine (a head node and two
more, one CPU and an 80 MiB object store each; so two workers always land on two nodes)
and shuts it down at the end, whatever happened. Each library runs as a driver of its own
(``bench/_ray_cluster_children.py``, connected with ``RAY_ADDRESS``), so the two never
share a driver process: Cairn with ``ScalingConfig(backend="ray", num_workers=2)``, Ray
Train with the v2 ``DataParallelTrainer``, the same train function,
``FailureConfig(max_failures=2)``, local storage (every node shares this machine's file
system). Cairn, then Ray, each run measuring three figures in one ``fit()``:

* **start-up**: ``fit()`` call to the first line of the train function on every rank
  (the last rank's), in the first attempt; the driver's ``ray.init(address=...)`` comes
  before and is noted apart.
* **worker crash**: a SYNC checkpoint (rank 0) every 0.5 s step; in the first attempt
  rank 0 writes the wall time and calls ``os._exit(1)`` right after the report of step 3
  returned. Figure: that time to the moment every rank of the restarted attempt has loaded
  its checkpoint (before its first step).
* **node loss**: the same loop goes on in the restarted attempt, and every rank holds
  right after the report of step 6 returned; this process then removes the node of the
  highest rank not on the head node (``cluster.remove_node``, Ray's default graceful stop
  of the node's processes), marks the removal done (the ranks left then go on with their
  next step, and meet the loss at its report, as a real job's would), and adds a node
  back at once, so the cluster's capacity returns (a replaced node). Figure: the wall
  time just before ``remove_node`` to every rank of the next attempt restored.

Both fault rows have a "checkpoints behind" row: the step of the last SYNC report that
returned against the step the run resumed from (one checkpoint per step). Each figure is
the median of 3 runs a side (1 with ``--quick``, N with ``--repeats N``); the note lists
every run. The runs go in rounds, one run a side per round in a driver of its own, the
order alternating between rounds, so that the machine's load falls on both sides alike;
the node-loss note gives each side's worst run and the load average at each removal.
Cairn's restart is broken down into phases (:data:`PHASES`; :data:`KEPT_PHASES` with
``--keep-survivors``). ``--warm-standby`` runs
Cairn with ``FailureConfig(warm_standby=True)``, ``--keep-survivors`` with
``FailureConfig(keep_survivors=True)`` (the rank that did not fail keeps its actor; only
the failed one is replaced, in its bundle of the placement group). With ``--no-ray``
only Cairn's side runs (on the same cluster); without Ray installed the benchmark is
skipped with a note, since both sides need it.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
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
import _ray_cluster_children as children  # noqa: E402
import _ray_reference as ray_ref  # noqa: E402

Row = _harness.Row

BENCHMARK = "ray_cluster"
NODE_ARGS: dict[str, Any] = {"num_cpus": 1, "object_store_memory": 80 * 1024 * 1024}
NUM_NODES = 3

METRIC_STARTUP = "fit() to first train line, 2 workers, 3-node cluster"
METRIC_CRASH = "worker crash to first step after restore, 3-node cluster"
METRIC_CRASH_BEHIND = "checkpoints behind last SYNC report, worker crash"
METRIC_NODE_LOSS = "node loss to first step after restore, 3-node cluster"
METRIC_NODE_LOSS_BEHIND = "checkpoints behind last SYNC report, node loss"

KINDS = ("startup", "crash", "node_loss")  # the figures of a run, in their order

# Bounds on every wait, in seconds: a child's whole run (fixed part + per repetition),
# and the wait for the ranks to hold before a node is removed.
CHILD_TIMEOUT_S = (90, 300)
HOLDING_TIMEOUT_S = 300.0
_POLL_S = 0.02

logger = logging.getLogger("bench.ray_cluster")


class ClusterBenchError(RuntimeError):
    """One side of one measurement failed; the message ends with its driver's log."""


class _Cluster:
    """The benchmark's own 3-node cluster; node changes happen on this (the main) thread."""

    def __init__(self) -> None:
        from ray import cluster_utils

        # Every node binds to 127.0.0.1 (Ray picks the loopback address when multi-host
        # clusters are off), and the Cairn and Ray drivers started below inherit it.
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        started = time.perf_counter()
        self.cluster = cluster_utils.Cluster(
            initialize_head=True, head_node_args={**NODE_ARGS, "include_dashboard": False}
        )
        try:
            self.restore()
        except BaseException:
            self.cluster.shutdown()
            raise
        self.start_s = time.perf_counter() - started

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    @property
    def head_id(self) -> str:
        return str(self.cluster.head_node.node_id)

    def restore(self) -> None:
        """Back to NUM_NODES nodes (after a removal, or a run that failed midway)."""
        while len(self.cluster.list_all_nodes()) < NUM_NODES:
            self.cluster.add_node(**NODE_ARGS)
        self.cluster.wait_for_nodes(timeout=120)

    def replace(self, node_id: str, removed_marker: Path) -> dict[str, float]:
        """Remove the worker node ``node_id``, create ``removed_marker`` (the ranks left go
        on training), then add a node back; wall time of the removal."""
        node = next((n for n in self.cluster.worker_nodes if n.node_id == node_id), None)
        if node is None:
            raise ClusterBenchError(f"node {node_id} is not a worker node of the cluster")
        load = os.getloadavg()[0]
        removed_t = time.time()
        started = time.perf_counter()
        self.cluster.remove_node(node)
        removed_s = time.perf_counter() - started
        removed_marker.touch()
        self.restore()
        return {"t": removed_t, "remove_s": removed_s, "load": load,
                "add_s": time.perf_counter() - started - removed_s}

    def shutdown(self) -> None:
        self.cluster.shutdown()


# --------------------------------------------------------------------------------------
# One side of one measurement, in a driver process of its own
# --------------------------------------------------------------------------------------


def _child_timeout(repeats: int) -> float:
    fixed, per_run = CHILD_TIMEOUT_S
    return float(fixed + per_run * repeats)


def _read_holding(out: Path) -> dict[int, str] | None:
    """Rank -> Ray node of every rank that holds, once all of them do."""
    files = sorted(out.glob("holding_*.json"))
    if len(files) < children.NUM_WORKERS:
        return None
    try:
        return {int(p.stem.split("_")[1]): json.loads(p.read_text(encoding="utf-8"))["node"]
                for p in files}
    except (OSError, ValueError, KeyError):
        return None  # still being written (written with os.replace, but be safe)


def _remove_nodes(cluster: _Cluster, proc: subprocess.Popen[bytes], work: Path,
                  repeats: int, deadline: float) -> list[dict[str, Any]]:
    """For each run: wait until every rank holds, replace a worker's node, say go."""
    removals: list[dict[str, Any]] = []
    for index in range(repeats):
        out = work / f"run{index}" / "out"
        holding_deadline = min(deadline, time.monotonic() + HOLDING_TIMEOUT_S)
        nodes = None
        while nodes is None:
            if proc.poll() is not None or time.monotonic() > holding_deadline:
                return removals  # the caller reports the child's exit or its timeout
            time.sleep(_POLL_S)
            nodes = _read_holding(out)
        # With one CPU a node, no other rank shares the node of the rank chosen.
        lost_rank = next((r for r in sorted(nodes, reverse=True) if nodes[r] != cluster.head_id),
                         None)
        if lost_rank is None:
            raise ClusterBenchError(f"every rank runs on the head node: {nodes}")
        removal = cluster.replace(nodes[lost_rank], out / "node_removed")
        removal.update(rank=lost_rank, node=nodes[lost_rank])
        removals.append(removal)
        logger.info("run %d: removed node %s (rank %d) in %.1f s, added one in %.1f s",
                    index, nodes[lost_rank][:12], lost_rank, removal["remove_s"],
                    removal["add_s"])
        if index + 1 < repeats:
            (work / f"go_{index + 1}").touch()
    return removals


def run_side(cluster: _Cluster, library: str, repeats: int, work: Path,
             options: tuple[str, ...] = ()) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The child's result (``connect_s``, ``runs``) and the node removals, one a run."""
    work.mkdir(parents=True)
    log_path = work / "driver.log"
    timeout_s = _child_timeout(repeats)
    env = ray_ref._child_env()
    env["RAY_ADDRESS"] = cluster.address
    command = [sys.executable, str(Path(children.__file__).resolve()), "--library", library,
               "--repeats", str(repeats), "--work-dir", str(work)]
    if library == "cairn":
        command += [f"--{option.replace('_', '-')}" for option in options]
    started = time.perf_counter()
    removals: list[dict[str, Any]] = []
    with open(log_path, "wb") as log:
        # A session of its own: on timeout the driver and anything it started die together.
        proc = subprocess.Popen(command, env=env, cwd=str(_harness.REPO_ROOT), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        try:
            removals = _remove_nodes(cluster, proc, work, repeats, deadline)
            returncode = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            ray_ref._kill_group(proc)
            raise ClusterBenchError(
                f"{library} did not finish within {timeout_s:.0f} s (its driver's last "
                f"line: {ray_ref._tail(log_path, 1)}); last lines of its driver's log:\n"
                f"{ray_ref._tail(log_path)}") from None
        finally:
            ray_ref._kill_group(proc, only_leftovers=True)
    result_path = work / "result.json"
    if returncode != 0 or not result_path.exists():
        raise ClusterBenchError(
            f"{library} failed (exit status {returncode}): {ray_ref._tail(log_path, 1)}"
            f"\nlast lines of its driver's log:\n{ray_ref._tail(log_path)}")
    result = json.loads(result_path.read_text(encoding="utf-8"))
    if len(removals) != len(result["runs"]):
        raise ClusterBenchError(f"{len(removals)} node removals for {len(result['runs'])} runs")
    logger.info("%s: %d runs in %.1f s", library, len(result["runs"]),
                time.perf_counter() - started)
    return result, removals


# --------------------------------------------------------------------------------------
# Figures and rows
# --------------------------------------------------------------------------------------


PHASES = (
    ("detect", "detection"),            # fault -> the attempt's failure handled (group killed)
    ("relaunch", "new attempt"),        # -> the next attempt starts
    ("place", "placement"),             # -> the placement group ready
    ("actors", "actor start"),          # -> every worker actor runs (process up, Ray imported)
    ("connect", "worker connect"),      # -> every worker connected to the controller
    ("train", "to train function"),     # -> the last rank's first line of the train function
    ("restore", "restore"),             # -> the last rank's checkpoint loaded
)
"""Cairn's restart, phase by phase: each is the time from the end of the one before."""

KEPT_PHASES = (
    ("detect", "detection"),            # fault -> the attempt's failure handled
    ("relaunch", "new attempt"),        # -> the next attempt starts (survivors stopped)
    ("replace", "replacement"),         # -> the failed rank's new actor runs in its bundle
    ("connect", "worker connect"),      # -> every worker connected to the controller
    ("train", "to train function"),     # -> the last rank's first line of the train function
    ("restore", "restore"),             # -> the last rank's checkpoint loaded
)
"""The same with ``keep_survivors``, where only the failed rank's actor is started again
(its bundle placed again first when its node was lost) and the others are kept."""

_LABELS = dict(PHASES + KEPT_PHASES)


def _event_t(events: list[dict[str, Any]], kind: str, attempt: int) -> float | None:
    times = [float(e["t"]) for e in events if e.get("type") == kind and e.get("attempt") == attempt]
    return min(times) if times else None


def _cairn_run_phases(run: dict[str, Any], fault: dict[str, Any],
                      fault_t: float) -> dict[str, float] | None:
    """One run's phases (seconds, see :data:`PHASES`), from the run's event log, the
    backend's log lines and the ranks' own times; None where something is missing."""
    if not run.get("run_path"):
        return None
    events = _harness.read_run_events(run["run_path"])
    attempt = int(fault["attempt"])
    failed = _event_t(events, "failure", attempt - 1)
    started = _event_t(events, "attempt_start", attempt)
    ready = _event_t(events, "workers_ready", attempt)
    if failed is None or started is None or ready is None:
        return None
    backend = run.get("backend_times", {})
    placed = next((t for t in backend.get("placed", []) if t >= started), None)
    actors = next((t for t in backend.get("actors", []) if t >= started), None)
    replaced = next((t for t in backend.get("replaced", []) if t >= started), None)
    first_line = max(float(r["first_line_t"]) for r in fault["ranks"])
    restored = float(fault["restore_t"])
    phases, marks = ((KEPT_PHASES, [fault_t, failed, started, replaced, ready, first_line,
                                    restored]) if replaced is not None
                     else (PHASES, [fault_t, failed, started, placed, actors, ready,
                                    first_line, restored]))
    if any(m is None for m in marks):
        return None
    points = [float(m) for m in marks if m is not None]
    return {key: b - a for (key, _), a, b in zip(phases, points[:-1], points[1:], strict=True)}


def _cairn_phases(runs: list[dict[str, Any]], kind: str, fault_times: list[float]) -> str:
    """Cairn's median per phase, and each run's slowest rank's process start to its
    train function's first line (Ray worker start + imports), for processes started after
    the fault (not a kept rank's, nor a warm standby spare's)."""
    samples: dict[str, list[float]] = {}
    spawn: list[float] = []
    for run, fault_t in zip(runs, fault_times, strict=True):
        phases = _cairn_run_phases(run, run[kind], fault_t)
        for key, value in (phases or {}).items():
            samples.setdefault(key, []).append(value)
        starts = [float(r["first_line_t"]) - float(r["process_start_t"])
                  for r in run[kind]["ranks"]
                  if r.get("process_start_t") and float(r["process_start_t"]) >= fault_t]
        if starts:
            spawn.append(max(starts))
    parts = [f"{_LABELS[key]} {_harness.median(values):.2f}" for key, values in samples.items()]
    if spawn:
        parts.append(f"(a new process's start to its train function: {_list(spawn)})")
    return ("Cairn phases (median s): " + ", ".join(parts)) if parts else ""


def _figures(kind: str, result: dict[str, Any],
             removals: list[dict[str, Any]]) -> dict[str, Any]:
    runs = result["runs"]
    if kind == "startup":
        times = [float(r["fit_to_first_line_s"]) for r in runs]
        return {"times": times, "connect_s": float(result["connect_s"])}
    faults = [r[kind] for r in runs]
    fault_times = ([float(f["fault_t"]) for f in faults] if kind == "crash"
                   else [float(m["t"]) for m in removals])
    times = [float(f["restore_t"]) - t for f, t in zip(faults, fault_times, strict=True)]
    behind = [int(f["last_reported_step"]) - int(f["resumed_from_step"]) for f in faults]
    figures: dict[str, Any] = {"times": times, "behind": behind,
                               "phases": _cairn_phases(runs, kind, fault_times)}
    if kind == "node_loss":
        figures["remove_s"] = [float(m["remove_s"]) for m in removals]
        figures["load"] = [float(m["load"]) for m in removals]
    return figures


def _list(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def _rows(kind: str, sides: dict[str, dict[str, Any]], repeats: int,
          options: tuple[str, ...] = ()) -> list[Row]:
    cairn, ray = sides.get("cairn"), sides.get("ray")

    def value(side: dict[str, Any] | None, key: str = "times") -> float | None:
        return _harness.median(side[key]) if side is not None else None

    def runs(name: str, side: dict[str, Any] | None) -> str:
        return f"{name} {_list(side['times'])}" if side is not None else ""

    listed = "; ".join(p for p in (runs("Cairn", cairn), runs("Ray", ray)) if p)
    note = f"median of {repeats} ({listed} s)"
    if options and cairn is not None:
        note += f"; Cairn with FailureConfig({', '.join(o + '=True' for o in options)})"
    if kind == "startup":
        connects = [f"{name} {side['connect_s']:.2f}" for name, side in
                    (("Cairn", cairn), ("Ray", ray)) if side is not None]
        return [Row(benchmark=BENCHMARK, metric=METRIC_STARTUP, cairn=value(cairn),
                    reference=value(ray),
                    note=f"{note}; last rank's first line, first attempt of the fault run; "
                    "driver's ray.init(address) "
                    f"before fit(), not in it: {', '.join(connects)} s")]
    metric, behind_metric = ((METRIC_CRASH, METRIC_CRASH_BEHIND) if kind == "crash"
                             else (METRIC_NODE_LOSS, METRIC_NODE_LOSS_BEHIND))
    what = (f"os._exit(1) on rank 0 right after the SYNC checkpoint report of step "
            f"{children.CRASH_STEP} returned" if kind == "crash" else
            "in the attempt after the crash, remove_node of a worker's node right after "
            f"the SYNC checkpoint report of step {children.NODE_LOSS_STEP} returned, a node "
            "added back at once")
    extra = [what, "every rank restored"]
    if cairn is not None and cairn["phases"]:
        extra.append(cairn["phases"])
    if kind == "node_loss":
        named = [(name, side) for name, side in (("Cairn", cairn), ("Ray", ray))
                 if side is not None]
        removes = "; ".join(f"{name} {_list(side['remove_s'])}" for name, side in named)
        extra.append(f"remove_node itself took {removes} s")
        extra.append("worst " + ", ".join(f"{name} {max(side['times']):.2f}"
                                          for name, side in named) + " s")
        if cairn is not None and ray is not None:
            ratio = max(cairn["times"]) / _harness.median(ray["times"])
            extra.append(f"Cairn's worst / Ray's median {ratio:.2f}")
        loads = "; ".join(f"{name} {_list(side['load'])}" for name, side in named)
        extra.append(f"1-min load average at each removal: {loads}")
    rows = [Row(benchmark=BENCHMARK, metric=metric, cairn=value(cairn), reference=value(ray),
                note="; ".join([note, *extra]))]

    def worst(side: dict[str, Any] | None) -> float | None:
        return float(max(side["behind"])) if side is not None else None

    behind = "; ".join(f"{name} {side['behind']}" for name, side in
                       (("Cairn", cairn), ("Ray", ray)) if side is not None)
    rows.append(Row(benchmark=BENCHMARK, metric=behind_metric, cairn=worst(cairn),
                    reference=worst(ray), unit="ckpts",
                    note=f"worst of {repeats} (per run: {behind}); target 0"))
    return rows


def _merge(side: dict[str, Any] | None, result: dict[str, Any],
           removals: list[dict[str, Any]]) -> dict[str, Any]:
    """One more child's runs and removals on a library's side."""
    if side is None:
        return {"result": {**result, "runs": list(result["runs"])},
                "connects": [float(result["connect_s"])], "removals": list(removals)}
    side["result"]["runs"].extend(result["runs"])
    side["connects"].append(float(result["connect_s"]))
    side["removals"].extend(removals)
    return side


def measure(args: Any) -> list[Row]:
    repeats = getattr(args, "repeats", None) or (1 if getattr(args, "quick", False) else 3)
    libraries = ["cairn"] if getattr(args, "no_ray", False) else ["cairn", "ray"]
    sides: dict[str, dict[str, dict[str, Any]]] = {kind: {} for kind in KINDS}
    merged: dict[str, dict[str, Any]] = {}
    errors: list[Row] = []
    failed: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="cairn-bench-ray-cluster-") as tmp:
        logger.info("starting a %d-node Ray cluster", NUM_NODES)
        cluster = _Cluster()
        try:
            logger.info("cluster up in %.1f s at %s", cluster.start_s, cluster.address)
            # One run a side per round, the order alternating between rounds, so that a
            # change in the machine's load falls on both sides alike.
            for index in range(repeats):
                order = libraries if index % 2 == 0 else libraries[::-1]
                for library in order:
                    if library in failed:
                        continue
                    try:
                        cluster.restore()
                        result, removals = run_side(
                            cluster, library, 1, Path(tmp, library, f"round{index}"),
                            options=_options(args))
                        merged[library] = _merge(merged.get(library), result, removals)
                    except Exception as exc:  # one side failing must not lose the other
                        logger.exception("%s failed", library)
                        failed.add(library)
                        errors.append(_harness.error_row(
                            BENCHMARK, exc, metric=f"{_side_name(library)} error"))
        finally:
            cluster.shutdown()
        # Read while the runs' event logs (under tmp) still exist.
        if os.environ.get("CAIRN_BENCH_RAY_CLUSTER_DUMP"):  # every run's raw times, as JSON
            Path(os.environ["CAIRN_BENCH_RAY_CLUSTER_DUMP"]).write_text(
                json.dumps(merged, indent=1), encoding="utf-8")
        for library, side in merged.items():
            side["result"]["connect_s"] = _harness.median(side["connects"])
            for kind in KINDS:
                sides[kind][library] = _figures(kind, side["result"], side["removals"])
    rows = [row for kind in KINDS if sides[kind]
            for row in _rows(kind, sides[kind], repeats, _options(args))]
    return rows + errors


def _options(args: Any) -> tuple[str, ...]:
    """The Cairn ``FailureConfig`` options turned on (``--warm-standby``,
    ``--keep-survivors``)."""
    return tuple(name for name in ("warm_standby", "keep_survivors")
                 if getattr(args, name, False))


def _side_name(library: str) -> str:
    return "Cairn" if library == "cairn" else "Ray Train"


def run(args: Any = None) -> list[Row]:
    """The rows: Cairn's figures, with Ray Train 2.60's on the same cluster as references."""
    args = args if args is not None else _module.parse_args(__doc__)
    if ray_ref.ray_version() is None:
        return [Row(benchmark=BENCHMARK, metric="skipped", unit="", reference_name="",
                    note="Ray is not installed (both sides need it): "
                    "pip install 'cairn-train[ray]' 'ray[train]==2.60.0'")]
    try:
        return measure(args)
    except Exception as exc:  # the cluster did not start: one clear row
        logger.exception("the Ray cluster benchmark failed")
        return [_harness.error_row(BENCHMARK, exc)]


def _own_options(argv: list[str] | None) -> tuple[list[str], Any]:
    """This module's own options (``--repeats N``, ``--warm-standby``,
    ``--keep-survivors``) and the rest."""
    import argparse

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--repeats", type=int, default=None,
                        help="runs a side (default 3, 1 with --quick)")
    parser.add_argument("--warm-standby", action="store_true",
                        help="Cairn's side with FailureConfig(warm_standby=True)")
    parser.add_argument("--keep-survivors", action="store_true",
                        help="Cairn's side with FailureConfig(keep_survivors=True)")
    own, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if own.repeats is not None and own.repeats < 1:
        raise SystemExit(f"--repeats {own.repeats}: give at least 1 run a side")
    return rest, own


def main(argv: list[str] | None = None) -> int:
    rest, own = _own_options(argv)

    def run_with_options(args: Any) -> list[Row]:
        args.repeats, args.warm_standby = own.repeats, own.warm_standby
        args.keep_survivors = own.keep_survivors
        return run(args)

    return _module.module_main(__doc__, run_with_options, rest)


if __name__ == "__main__":
    sys.exit(main())
