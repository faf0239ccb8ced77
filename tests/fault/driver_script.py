"""A training driver run as its own process, so tests can kill -9 it and run it again.

python driver_script.py STORAGE NAME SCRATCH [--steps N] [--step-s S] [--faultfs]
                        [--backend local|ray] [--workers N]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fault_store
import fault_workloads

import cairn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("storage")
    parser.add_argument("name")
    parser.add_argument("scratch")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--step-s", type=float, default=0.2)
    parser.add_argument("--max-failures", type=int, default=0)
    parser.add_argument("--backend", default="local")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    fault_store.register()
    run_dir = os.path.join(args.storage, args.name)
    result = cairn.Trainer(
        fault_workloads.resumable,
        train_loop_config={"steps": args.steps, "step_s": args.step_s, "scratch": args.scratch,
                           "run_dir": run_dir, "first_index": 1},
        scaling_config=cairn.ScalingConfig(num_workers=args.workers, backend=args.backend),
        run_config=cairn.RunConfig(
            name=args.name, storage_path=args.storage,
            failure_config=cairn.FailureConfig(max_failures=args.max_failures)),
    ).fit()
    print(json.dumps({"metrics": result.metrics, "attempts": result.goodput.attempts}))


if __name__ == "__main__":
    main()
