"""How much a background checkpoint upload slows the training loop's steps.

Usage::

    python bench/train_step.py [--quick]

Two Cairn runs of one local worker on local storage in a temporary directory: a pure-Python
step (a fixed loop of integer arithmetic, a few milliseconds) under ``cairn.Trainer``, and a
torch step (forward, backward and SGD update of a small MLP on CPU, one thread) under
``cairn.torch.TorchTrainer``. The worker times every step (``time.perf_counter``, and its
thread's CPU time) through phases that alternate, in one run:

1. **idle**: nothing in flight, for a fixed time (the reference of every busy phase);
2. **upload**: ``report(checkpoint=..., checkpoint_upload_mode="ASYNC")`` of a 512 MiB
   directory written before (8 files, random bytes), then steps until ``handle.done()``
   (the upload's threads hash and copy in this process; the commit is the driver's);
3. **out-of-process copy**: the same directory copied by ``pyarrow.fs.copy_files`` in
   another process (started and imported before the timing), steps until it exits: the
   same I/O and CPU load without sharing this process's GIL, so the part of a slowdown
   that only the machine's cores explain;
4. **snapshot**: ``cairn.torch.report_snapshot`` of a 512 MB state of float32 tensors
   (serialization and upload on the upload thread), steps until ``handle.done()``;
5. the upload, the copy and the snapshot again with the loop asleep (polling every
   millisecond): how long the background work takes when no step competes with it, the
   reference of its time to commit during steps. The copy in its own process shares the
   cores but not the GIL, so the upload's slowdown beyond the copy's is the GIL's.

Five rounds of these (one with ``--quick``, and 128 MiB), an idle phase closing the
run; ``os.sync()`` before every phase, so that no phase pays for the dirty pages of the
one before. Rows: a busy kind's median (and p90) step time over the idle phases' median
(p90), samples of all rounds pooled (issue target: at most 1.05x median, 1.2x p90).
``run(args)`` returns the rows for ``bench/run_all.py``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
for _path in (str(BENCH_DIR.parent), str(BENCH_DIR)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import _harness  # noqa: E402
import _module  # noqa: E402

import cairn  # noqa: E402

Row = _harness.Row

BENCHMARK = "train_step"
NUM_FILES = 8
WARMUP_STEPS = 100
PYTHON_STEP_ITERATIONS = 20_000
MLP_WIDTH = 256
MLP_BATCH = 64
TENSOR_MB = 16.0
TARGET_MEDIAN = 1.05
TARGET_P90 = 1.2
WAIT_POLL_S = 0.001

BUSY_KINDS = ("upload", "external", "snapshot")

# Run in its own interpreter: import first, say so, wait for the word, then copy.
_COPY_CHILD = """\
import sys
import pyarrow.fs as pafs
local = pafs.LocalFileSystem()
print("ready", flush=True)
sys.stdin.readline()
pafs.copy_files(sys.argv[1], sys.argv[2], source_filesystem=local,
                destination_filesystem=local)
"""

logger = logging.getLogger("bench.train_step")


@dataclass(frozen=True)
class Settings:
    size_mib: float
    rounds: int
    idle_s: float


FULL = Settings(size_mib=512.0, rounds=5, idle_s=1.5)
QUICK = Settings(size_mib=128.0, rounds=1, idle_s=1.0)


# --------------------------------------------------------------------------------------
# Steps (built in the worker)
# --------------------------------------------------------------------------------------


def python_step() -> None:
    """A fixed amount of pure-Python work: it holds the GIL throughout."""
    x = 1
    for _ in range(PYTHON_STEP_ITERATIONS):
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF


def make_torch_step() -> Callable[[], None]:
    """Forward, backward and update of a small MLP on CPU, torch on one thread."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(MLP_WIDTH, MLP_WIDTH), torch.nn.ReLU(),
        torch.nn.Linear(MLP_WIDTH, MLP_WIDTH), torch.nn.ReLU(),
        torch.nn.Linear(MLP_WIDTH, 10),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs = torch.randn(MLP_BATCH, MLP_WIDTH)
    targets = torch.randint(0, 10, (MLP_BATCH,))
    loss_fn = torch.nn.CrossEntropyLoss()

    def step() -> None:
        optimizer.zero_grad()
        loss_fn(model(inputs), targets).backward()
        optimizer.step()

    return step


def make_state(state_mb: float) -> dict[str, Any]:
    """float32 tensors of 16 MB each, ``state_mb`` MB in all."""
    import torch

    state: dict[str, Any] = {}
    total = int(state_mb * 1e6) // 4
    per_tensor = int(TENSOR_MB * 1e6) // 4
    while total > 0:
        count = min(per_tensor, total)
        state[f"layer_{len(state)}.weight"] = torch.randn(count)
        total -= count
    return state


# --------------------------------------------------------------------------------------
# The train function (runs in Cairn's worker process)
# --------------------------------------------------------------------------------------


def _train_phases(config: dict[str, Any]) -> None:
    step = make_torch_step() if config["step"] == "torch" else python_step
    wall, cpu = time.perf_counter, time.thread_time
    scratch, storage = Path(config["scratch"]), Path(config["storage"])
    payload = scratch / "payload"
    _harness.make_checkpoint_dir(payload, float(config["size_mib"]), NUM_FILES)
    state = make_state(float(config["size_mib"]) * 2**20 / 1e6)
    phases: list[dict[str, Any]] = []

    def timed_steps(until: Callable[[], bool]) -> tuple[list[float], list[float]]:
        walls: list[float] = []
        cpus: list[float] = []
        while not until():
            started_wall, started_cpu = wall(), cpu()
            step()
            walls.append(wall() - started_wall)
            cpus.append(cpu() - started_cpu)
        return walls, cpus

    def waited(until: Callable[[], bool]) -> tuple[list[float], list[float]]:
        while not until():
            time.sleep(WAIT_POLL_S)
        return [], []

    def phase(kind: str, number: int, start: Callable[[], Callable[[], bool]],
              steps: bool = True) -> None:
        os.sync()
        started = wall()
        until = start()
        blocked = wall() - started
        walls, cpus = timed_steps(until) if steps else waited(until)
        phases.append({"kind": kind, "round": number, "walls": walls, "cpus": cpus,
                       "blocked_s": blocked, "seconds": wall() - started})

    def idle(_number: int) -> Callable[[], Callable[[], bool]]:
        def start() -> Callable[[], bool]:
            deadline = wall() + float(config["idle_s"])
            return lambda: wall() >= deadline
        return start

    def upload(number: int) -> Callable[[], Callable[[], bool]]:
        def start() -> Callable[[], bool]:
            handle = cairn.report(
                {"round": number, "kind": "upload"},
                checkpoint=cairn.Checkpoint.from_directory(str(payload)),
                checkpoint_upload_mode=cairn.CheckpointUploadMode.ASYNC,
                delete_local_checkpoint_after_upload=False,
            )
            return handle.done
        return start

    def external(number: int) -> Callable[[], Callable[[], bool]]:
        destination = storage / f"external_copy_{number}"
        destination.mkdir()
        child = subprocess.Popen(
            [sys.executable, "-c", _COPY_CHILD, str(payload), str(destination)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        assert child.stdin is not None and child.stdout is not None
        if child.stdout.readline().strip() != "ready":
            raise RuntimeError("the copy process did not start")

        def start() -> Callable[[], bool]:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
            return lambda: child.poll() is not None
        return start

    def snapshot(number: int) -> Callable[[], Callable[[], bool]]:
        from cairn.torch import report_snapshot

        def start() -> Callable[[], bool]:
            return report_snapshot({"round": number, "kind": "snapshot"}, state).done
        return start

    for _ in range(WARMUP_STEPS):
        step()
    for number in range(int(config["rounds"])):
        for kind, starter in (("upload", upload), ("external", external),
                              ("snapshot", snapshot)):
            phase("idle", number, idle(number))
            phase(kind, number, starter(number))
            if kind == "external":
                shutil.rmtree(storage / f"external_copy_{number}")
        # The same background work with the loop asleep: how long it takes on its own.
        phase("upload_waiting", number, upload(number), steps=False)
        phase("external_waiting", number, external(number), steps=False)
        shutil.rmtree(storage / f"external_copy_{number}")
        phase("snapshot_waiting", number, snapshot(number), steps=False)
    phase("idle", int(config["rounds"]), idle(int(config["rounds"])))
    out = Path(config["out"])
    out.write_text(json.dumps({"phases": phases}), encoding="utf-8")


# --------------------------------------------------------------------------------------
# Measurements (driver side)
# --------------------------------------------------------------------------------------


def measure(work: Path, step_kind: str, settings: Settings) -> list[dict[str, Any]]:
    """The phases of one run: ``{kind, round, walls, cpus, blocked_s, seconds}`` each."""
    scratch = work / "scratch"
    scratch.mkdir()
    out = work / "phases.json"
    config = {
        "step": step_kind, "scratch": str(scratch), "storage": str(work), "out": str(out),
        "size_mib": settings.size_mib, "rounds": settings.rounds, "idle_s": settings.idle_s,
    }
    run_config = cairn.RunConfig(
        name=f"train_step_{step_kind}", storage_path=str(work), progress=0,
        checkpoint_config=cairn.CheckpointConfig(num_to_keep=1),
    )
    scaling = cairn.ScalingConfig(num_workers=1)
    trainer: cairn.Trainer
    if step_kind == "torch":
        from cairn.torch import TorchTrainer

        trainer = TorchTrainer(_train_phases, train_loop_config=config,
                               scaling_config=scaling, run_config=run_config)
    else:
        trainer = cairn.Trainer(_train_phases, train_loop_config=config,
                                scaling_config=scaling, run_config=run_config)
    trainer.fit()
    phases: list[dict[str, Any]] = json.loads(out.read_text(encoding="utf-8"))["phases"]
    return phases


def pooled(phases: list[dict[str, Any]], kind: str, key: str = "walls") -> list[float]:
    return [s for p in phases if p["kind"] == kind for s in p[key]]


def step_rows(step_kind: str, phases: list[dict[str, Any]], settings: Settings) -> list[Row]:
    label = "pure-Python step" if step_kind == "python" else "torch MLP step"
    trainer = "cairn.Trainer" if step_kind == "python" else "cairn.torch.TorchTrainer"
    idle = pooled(phases, "idle")
    idle_cpu = pooled(phases, "idle", "cpus")
    idle_median, idle_p90 = _harness.median(idle), _harness.percentile(idle, 90)
    idle_medians = [_harness.median(p["walls"]) for p in phases if p["kind"] == "idle"]
    ms = 1e3
    size = f"{settings.size_mib:g} MiB"
    what = {
        "upload": f"during a {size} ASYNC upload",
        "external": f"during an out-of-process copy_files of {size}",
        "snapshot": f"during a {size} report_snapshot",
    }
    rows: list[Row] = []
    for kind in BUSY_KINDS:
        busy = pooled(phases, kind)
        if not busy:
            continue
        busy_cpu = pooled(phases, kind, "cpus")
        per_phase = [_harness.median(p["walls"]) / idle_median
                     for p in phases if p["kind"] == kind and p["walls"]]
        blocked = [p["blocked_s"] for p in phases if p["kind"] == kind]
        seconds = [p["seconds"] for p in phases if p["kind"] == kind]
        rounds = len(seconds)
        common = (f"{trainer}, 1 worker; {len(busy)} busy / {len(idle)} idle steps over "
                  f"{rounds} phase(s) of {_harness.median(seconds):.2f} s")
        median_note = (
            f"target <= {TARGET_MEDIAN:g}x; per phase {min(per_phase):.2f}-"
            f"{max(per_phase):.2f}x; mean {statistics.fmean(busy) * ms:.2f} vs "
            f"{statistics.fmean(idle) * ms:.2f} ms; thread CPU per step busy/idle "
            f"{_harness.median(busy_cpu) / _harness.median(idle_cpu):.2f}x; idle phase "
            f"medians {min(idle_medians) * ms:.2f}-{max(idle_medians) * ms:.2f} ms; {common}")
        if kind != "external":
            median_note += f"; call blocked {_harness.median(blocked) * ms:.1f} ms (not a step)"
        else:
            median_note = ("reference for the CPU share alone (no shared GIL); " + median_note)
        rows += [
            Row(benchmark=BENCHMARK, metric=f"{label} median {what[kind]}",
                cairn=_harness.median(busy) * ms, reference=idle_median * ms,
                reference_name="same step idle, same run", unit="ms", note=median_note),
            Row(benchmark=BENCHMARK, metric=f"{label} p90 {what[kind]}",
                cairn=_harness.percentile(busy, 90) * ms, reference=idle_p90 * ms,
                reference_name="same step idle, same run", unit="ms",
                note=(f"target <= {TARGET_P90:g}x" if kind != "external" else "reference")
                + f"; p99 {_harness.p99(busy) * ms:.2f} ms vs {_harness.p99(idle) * ms:.2f} ms"),
        ]
    shares = {"upload": "in this process: shares the cores and the GIL",
              "external": "in another process: shares the cores only",
              "snapshot": "in this process: shares the cores and the GIL"}
    spans = {"upload": "call to commit", "external": "start to exit",
             "snapshot": "call to commit"}
    for kind, name in (("upload", f"ASYNC upload {size}"),
                       ("external", f"out-of-process copy_files {size}"),
                       ("snapshot", f"report_snapshot {size}")):
        busy_s = [p["seconds"] for p in phases if p["kind"] == kind]
        asleep_s = [p["seconds"] for p in phases if p["kind"] == f"{kind}_waiting"]
        if not busy_s or not asleep_s:
            continue
        rows.append(
            Row(benchmark=BENCHMARK, metric=f"{name}, {spans[kind]}, during {label}s",
                cairn=_harness.median(busy_s), reference=_harness.median(asleep_s),
                reference_name="same, the loop asleep (same run)",
                note=f"{shares[kind]}; median of {len(busy_s)}, range {min(busy_s):.2f}-"
                     f"{max(busy_s):.2f} s vs {min(asleep_s):.2f}-{max(asleep_s):.2f} s"))
    return rows


def cairn_rows(args: Any) -> list[Row]:
    settings = QUICK if getattr(args, "quick", False) else FULL
    rows: list[Row] = []
    for step_kind in ("python", "torch"):
        logger.info("train steps (%s): %d round(s), %g MiB", step_kind, settings.rounds,
                    settings.size_mib)
        with _harness.quiet_logger("cairn"), tempfile.TemporaryDirectory(
            prefix=f"cairn-bench-train-step-{step_kind}-"
        ) as tmp:
            phases = measure(Path(tmp), step_kind, settings)
        rows += step_rows(step_kind, phases, settings)
    return rows


def run(args: Any = None) -> list[Row]:
    """Busy step times beside idle ones, from the same run (no Ray reference)."""
    args = args if args is not None else _module.parse_args(__doc__)
    return cairn_rows(args)


def main(argv: list[str] | None = None) -> int:
    return _module.module_main(__doc__, run, argv)


if __name__ == "__main__":
    sys.exit(main())
