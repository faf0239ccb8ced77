"""TorchTrainer (gloo) crash to first step after restore, with and without warm standby
workers (``FailureConfig(warm_standby=True)``), in one run; with ``--survivors``, one rank
of two killed with the survivor kept (``FailureConfig(keep_survivors=True)``) against the
whole group restarted, at 64 MiB and 1 GiB of training state.

Usage::

    python bench/torch_recovery.py [--quick] [--runs 3]
    python bench/torch_recovery.py --survivors [--warm-standby] [--runs 3] [--sizes-mib 64,1024]

Two workers of ``cairn.torch.TorchTrainer`` on CPUs (gloo) train a small MLP wrapped by
``prepare_model`` (DDP), a step of 0.5 s, one SYNC checkpoint (``save_training_state``)
per step. On the
first attempt rank 0 writes the wall time and calls ``os._exit(1)`` right after the report
of step 3 returned; the restarted attempt writes the wall time once it has restored the
checkpoint and run one DDP step (so the process group is up again). The figure is the
median over ``--runs`` runs of crash to that first step; the reference is the same run
without warm standby, in the same invocation (target: at most 0.5x). ``run(args)`` returns
the rows for ``bench/run_all.py`` (``quick``: 1 run each).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from _harness import print_table

import cairn

CRASH_AFTER = 3
STEP_S = 0.5  # a step's time (as bench/recovery.py): the crash comes 2 s into training


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one run of each")
    parser.add_argument("--runs", type=int, default=None, help="runs of each (median)")
    parser.add_argument("--no-ray", action="store_true", help="accepted for run_all")
    parser.add_argument("--survivors", action="store_true",
                        help="keep_survivors against the whole-group restart instead")
    parser.add_argument("--sizes-mib", default="64,1024",
                        help="--survivors: training state sizes in MiB (comma-separated)")
    parser.add_argument("--warm-standby", action="store_true",
                        help="--survivors: both sides with FailureConfig(warm_standby=True), "
                             "and a third side: the whole-group restart with the defaults")
    return parser.parse_args(argv)


def _write(path: str, value: float) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"t": value}, f)
    os.replace(tmp, path)


def train(config: dict[str, Any]) -> None:
    import torch

    import cairn.torch as ct

    torch.manual_seed(0)
    model = ct.prepare_model(torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    context = cairn.get_context()
    rank, attempt = context.get_world_rank(), context.get_attempt()
    start = 0
    checkpoint = cairn.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as restored:
            start = ct.load_training_state(restored, model=model, optimizer=optimizer).step + 1
    data = torch.randn(32, 64)
    for step in range(start, config["steps"]):
        optimizer.zero_grad()
        model(data).pow(2).mean().backward()
        optimizer.step()
        time.sleep(STEP_S)
        if attempt > 0 and step == start and rank == 0:
            _write(os.path.join(config["out"], "first_step"), time.time())
        with tempfile.TemporaryDirectory() as local:
            ct.save_training_state(local, model=model, optimizer=optimizer, step=step)
            cairn.report({"step": step}, checkpoint=cairn.Checkpoint.from_directory(local))
        if attempt == 0 and step == CRASH_AFTER and rank == 0:
            _write(os.path.join(config["out"], "crash"), time.time())
            os._exit(1)


def one_run(warm_standby: bool, scratch: str) -> float:
    out = tempfile.mkdtemp(dir=scratch)
    from cairn.torch import TorchTrainer

    TorchTrainer(
        train, train_loop_config={"steps": CRASH_AFTER + 3, "out": out},
        scaling_config=cairn.ScalingConfig(num_workers=2),
        run_config=cairn.RunConfig(
            name="torch-recovery", storage_path=os.path.join(out, "storage"), progress=0,
            failure_config=cairn.FailureConfig(max_failures=1, warm_standby=warm_standby)),
    ).fit()
    times = {}
    for name in ("crash", "first_step"):
        with open(os.path.join(out, name), encoding="utf-8") as f:
            times[name] = json.load(f)["t"]
    return float(times["first_step"] - times["crash"])


def run(args: Any = None) -> list[dict[str, Any]]:
    """Rows ``{benchmark, metric, cairn, reference, ratio, unit, ...}`` for the harness."""
    if args is None or isinstance(args, (list, tuple)):
        args = parse_args(args)
    if getattr(args, "survivors", False):
        from torch_survivors import run_survivors

        return run_survivors(args)
    quick = bool(getattr(args, "quick", False))
    runs = getattr(args, "runs", None) or (1 if quick else 3)
    scratch = tempfile.mkdtemp(prefix="cairn-bench-torch-recovery-")
    try:
        cold, warm = [], []
        for _ in range(runs):  # alternate, so that load drifts hit both alike
            cold.append(one_run(False, scratch))
            warm.append(one_run(True, scratch))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    cairn_s, reference = statistics.median(warm), statistics.median(cold)
    return [{
        "benchmark": "torch_recovery",
        "metric": "TorchTrainer (gloo, 2 workers) crash to first step after restore, "
                  "warm standby",
        "cairn": cairn_s, "reference": reference, "ratio": cairn_s / reference, "unit": "s",
        "reference_name": "the same without warm standby",
        "note": f"median of {runs}; warm {', '.join(f'{t:.2f}' for t in warm)} s, without "
                f"{', '.join(f'{t:.2f}' for t in cold)} s",
    }]


def main(argv: Sequence[str] | None = None) -> int:
    print_table(run(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
