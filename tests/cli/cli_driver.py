"""A driver run as its own process, so CLI tests see a live run and a run whose driver
was killed (kill -9): python cli_driver.py STORAGE NAME RELEASE_FILE.

Its train loop commits two checkpoints, then waits until RELEASE_FILE exists."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cli_workloads

import cairn


def main() -> None:
    storage, name, release = sys.argv[1:4]
    cairn.Trainer(cli_workloads.checkpoint_then_wait,
                  train_loop_config={"steps": 2, "release": release},
                  run_config=cairn.RunConfig(name=name, storage_path=storage)).fit()


if __name__ == "__main__":
    main()
