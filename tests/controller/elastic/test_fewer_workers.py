"""A backend that starts fewer workers than max_workers: the attempt's world is what ran.

The local backend always starts max_workers; a cluster may fit fewer. A local backend
whose capacity is capped plays that cluster here, with real worker processes.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

import pytest

import cairn
from cairn import ScalingConfig, Trainer
from cairn._src.backends.local import LocalBackend

RunConfigFactory = Callable[..., cairn.RunConfig]


def report_with_checkpoints() -> int:
    context = cairn.get_context()
    for step in range(2):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, f"rank_{context.get_world_rank()}.txt"), "w") as f:
                f.write(str(step))
            cairn.report({"step": step}, checkpoint=cairn.Checkpoint.from_directory(d))
    return context.get_world_size()


class CountReports(cairn.UserCallback):
    def __init__(self) -> None:
        self.ranks_per_report: list[int] = []

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]],
                     checkpoint: Any) -> None:
        self.ranks_per_report.append(len(metrics))


def test_a_group_smaller_than_max_workers_runs_with_the_world_it_got(
    run_config: RunConfigFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    start = LocalBackend.start

    def start_two(self: LocalBackend, num_workers: int, *args: Any, **kwargs: Any) -> Any:
        assert num_workers == 4  # asked for max_workers
        return start(self, 2, *args, **kwargs)

    monkeypatch.setattr(LocalBackend, "start", start_two)
    counter = CountReports()
    result = Trainer(report_with_checkpoints,
                     scaling_config=ScalingConfig(num_workers=(2, 4)),
                     run_config=run_config(callbacks=[counter])).fit()
    assert result.error is None
    assert result.return_value == 2
    assert result.checkpoint is not None
    assert sorted(result.checkpoint.get_manifest().files) == ["rank_0.txt", "rank_1.txt"]
    assert counter.ranks_per_report == [2, 2]
