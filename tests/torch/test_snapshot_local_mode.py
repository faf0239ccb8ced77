"""Local mode, ``ScalingConfig(num_workers=0)``, with TorchTrainer or a plain Trainer: the
snapshot buffers the train function fills live in the driver's process, which goes on
after ``fit()``; they are kept across the run's attempts and let go when ``fit()``
returns."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Any

import pytest
import torch

import cairn
from cairn import FailureConfig, ScalingConfig
from cairn._src.torch.snapshot import snapshot_buffers
from cairn._src.torch.snapshot_buffers import BufferSet
from cairn.torch import TorchTrainer, report_snapshot

# The buffer sets in the pool after each attempt's snapshots (the train function runs in
# this process).
_SEEN: list[list[weakref.ref[BufferSet]]] = []


def pooled() -> list[BufferSet]:
    pool = snapshot_buffers()
    with pool._lock:
        return list(pool._sets)


def snapshot_then_fail_once(config: dict[str, Any]) -> bool:
    state = {"w": torch.ones(1 << 16)}
    for step in range(2):
        report_snapshot({"step": step}, state).wait()
        state["w"].add_(1.0)
    sets = pooled()
    assert sets
    _SEEN.append([weakref.ref(s) for s in sets])
    if cairn.get_context().get_attempt() == 0:
        raise RuntimeError("the first attempt fails")
    # Whether the first attempt's buffers served this one too.
    return any(ref() is s for ref in _SEEN[0] for s in sets)


@pytest.mark.parametrize("trainer", [TorchTrainer, cairn.Trainer])
def test_snapshot_buffers_are_kept_across_attempts_and_let_go_when_fit_returns(
        run_config: Callable[..., cairn.RunConfig], trainer: type[cairn.Trainer]) -> None:
    # report_snapshot from a plain cairn.Trainer's function too: the driver frees the pool.
    _SEEN.clear()
    result = trainer(snapshot_then_fail_once, scaling_config=ScalingConfig(num_workers=0),
                     run_config=run_config(failure_config=FailureConfig(max_failures=1))
                     ).fit()
    assert result.return_value is True, "the next attempt reuses the first one's buffers"
    assert len(_SEEN) == 2
    remaining = pooled()
    assert not [s for s in remaining for refs in _SEEN for ref in refs if ref() is s]
    del remaining
    gc.collect()
    assert all(ref() is None for refs in _SEEN for ref in refs), "their memory is freed"
