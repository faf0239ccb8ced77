"""A driver whose every fsync is recorded and whose run kills it right after a commit.

python durable_script.py STORAGE SCRATCH [--no-fsync]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import durable_workloads

import cairn
from cairn.torch import TorchTrainer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("storage")
    parser.add_argument("scratch")
    parser.add_argument("--no-fsync", action="store_true")
    args = parser.parse_args()
    durable_workloads.record_fsyncs(os.path.join(args.scratch, "fsync_driver.jsonl"))
    TorchTrainer(
        durable_workloads.commit_then_die,
        train_loop_config={"scratch": args.scratch,
                           "storage": os.path.abspath(args.storage)},
        scaling_config=cairn.ScalingConfig(num_workers=2),
        run_config=cairn.RunConfig(name="run", storage_path=args.storage,
                                   storage_fsync=not args.no_fsync, progress=0),
    ).fit()


if __name__ == "__main__":
    main()
