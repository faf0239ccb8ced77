"""A driver with a validation function, run as its own process so tests can kill -9 it.

python validation_driver.py STORAGE NAME SCRATCH GATE
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import v2_workloads

import cairn


def main() -> None:
    storage, name, scratch, gate = sys.argv[1:5]
    result = cairn.Trainer(
        v2_workloads.validating,
        train_loop_config={"epochs": 2, "scores": [3, 4], "scratch": scratch},
        scaling_config=cairn.ScalingConfig(num_workers=2),
        run_config=cairn.RunConfig(name=name, storage_path=storage),
        validation_config=cairn.ValidationConfig(
            v2_workloads.read_score,
            cairn.ValidationTaskConfig(fn_kwargs={"gate": gate, "gated_score": 4})),
    ).fit()
    print(json.dumps({"best": [[os.path.basename(c.path), m] for c, m in
                               result.best_checkpoints]}))


if __name__ == "__main__":
    main()
