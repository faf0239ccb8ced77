"""A training driver run as its own process, so tests can kill -9 it and run it again.

python xyz_driver.py STORAGE_PATH SCRATCH --store xyz|guide_only --mode NO_UPLOAD|SYNC|ASYNC
    [--db DB] [--root ROOT] [--prefix PREFIX] [--steps N] [--step-s S]

With ``--store xyz`` this process registers nothing: the ``xyz`` scheme comes from the
entry point of the installed examples/xyzstorage package, as it would for a user's
restarted driver. With ``--store guide_only`` it imports guide_only_store, which registers
``flatdir`` in code (what the guide tells a driver script to do). Prints a JSON summary as
its last line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import xyz_workloads

import cairn
from cairn.storage import export_registrations


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("storage_path")
    parser.add_argument("scratch")
    parser.add_argument("--store", choices=["xyz", "guide_only"], required=True)
    parser.add_argument("--mode", choices=["NO_UPLOAD", "SYNC", "ASYNC"], required=True)
    parser.add_argument("--db", default="")
    parser.add_argument("--root", default="")
    parser.add_argument("--prefix", default="ckpts/run")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--step-s", type=float, default=0.2)
    args = parser.parse_args()
    if args.store == "guide_only":
        import guide_only_store  # noqa: F401  (registers flatdir://)
    config = {"store": args.store, "db": args.db, "root": args.root, "prefix": args.prefix,
              "steps": args.steps, "step_s": args.step_s, "scratch": args.scratch,
              "mode": args.mode, "note_commits": True}
    function = (xyz_workloads.own_checkpoints if args.mode == "NO_UPLOAD"
                else xyz_workloads.uploaded_checkpoints)
    result = cairn.Trainer(
        function,
        train_loop_config=config,
        scaling_config=cairn.ScalingConfig(num_workers=2),
        run_config=cairn.RunConfig(
            name="run", storage_path=args.storage_path,
            checkpoint_config=cairn.CheckpointConfig(num_to_keep=2)),
    ).fit()
    assert result.checkpoint is not None
    print(json.dumps({"metrics": result.metrics, "attempts": result.goodput.attempts,
                      "checkpoint": result.checkpoint.uri,
                      "registered_in_code": sorted(export_registrations())}))


if __name__ == "__main__":
    main()
