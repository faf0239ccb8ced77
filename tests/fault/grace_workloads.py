"""Training functions for the report-grace test (real worker processes)."""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

import cairn
from cairn import Checkpoint


def rank1_fails_after_three_reports(config: dict[str, Any]) -> None:
    """Rank 1 reports metrics only and raises right after its third report, while rank 0
    is still writing the checkpoints of reports 1-3 (it writes slowly)."""
    rank = cairn.get_context().get_world_rank()
    for step in range(config["steps"]):
        if rank == 1:
            cairn.report({"step": step})
            if step == 2:
                raise RuntimeError("rank 1 fails after its third report")
            continue
        time.sleep(config["write_s"])  # writing the checkpoint takes a while
        directory = tempfile.mkdtemp()
        with open(os.path.join(directory, "state"), "w") as f:
            f.write(str(step))
        cairn.report({"step": step}, checkpoint=Checkpoint.from_directory(directory))
