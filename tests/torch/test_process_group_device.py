"""Which CUDA device ``TorchTrainer``'s set-up hook picks, with ``torch.cuda`` and
``init_process_group`` stood in for (no GPU needed).

The local backend shows every GPU of the machine to every worker: ``cuda:<local rank>``.
On the Ray backend, Ray shows an actor only its own GPUs (8 workers on an 8-GPU node each
see one device); the backend then shows each worker the GPUs of all the workers of its
node (``CUDA_VISIBLE_DEVICES``) and its own ids (``CAIRN_GPU_IDS``), and the worker
trains on the device at the index of its own GPU, as Ray Train does."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch

import cairn
from cairn._src.torch import process_group
from cairn._src.torch.config import TorchConfig
from cairn._src.torch.process_group import (
    AttemptEnvironment,
    ProcessGroupSetup,
    destroy_process_group,
)
from cairn.torch import get_device


@dataclass(frozen=True)
class NodeContext:
    """A rank of a group that runs on one node (no rendezvous at rank 0's node)."""

    local_rank: int
    local_world_size: int

    def get_world_rank(self) -> int:
        return self.local_rank

    def get_world_size(self) -> int:
        return self.local_world_size

    def get_local_rank(self) -> int:
        return self.local_rank

    def get_local_world_size(self) -> int:
        return self.local_world_size

    def get_node_rank(self) -> int:
        return 0


@pytest.fixture
def gpus(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """``torch.cuda`` with ``count`` devices (set by the test), and what the hook did."""
    seen: dict[str, Any] = {"count": 1}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: seen["count"])
    monkeypatch.setattr(torch.cuda, "set_device",
                        lambda device: seen.__setitem__("set_device", device))
    monkeypatch.setattr(process_group.dist, "init_process_group",
                        lambda **kwargs: seen.__setitem__("init", kwargs))
    for name, value in AttemptEnvironment()(0).items():
        monkeypatch.setenv(name, value)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK",
                 "CUDA_VISIBLE_DEVICES", "CAIRN_GPU_IDS"):
        # Set, then deleted: monkeypatch removes what the hook sets once the test ends.
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    return seen


def _setup(context: NodeContext) -> torch.device:
    try:
        ProcessGroupSetup(TorchConfig(timeout_s=60), use_gpu=True)(context)
        return get_device()
    finally:
        destroy_process_group(context)


@pytest.mark.parametrize(("own", "visible", "count", "local_rank", "expected"), [
    # Ray's own visibility (each actor sees its one GPU): local rank 1 of 2 on cuda:0.
    ("1", "1", 1, 1, 0),
    # The backend's: every GPU of the node's workers, the device at the index of its own.
    ("1", "0,1", 2, 1, 1),
    ("6", "2,6", 2, 0, 1),  # Ray gave local rank 0 the node's second GPU
    ("2", "0,1,2,3,4,5,6,7", 8, 5, 2),
    # ScalingConfig(resources_per_worker={"GPU": 0.5}): two workers share GPU 0.
    ("0", "0", 1, 1, 0),
])
def test_a_ray_worker_trains_on_its_own_gpu(
    monkeypatch: pytest.MonkeyPatch, gpus: dict[str, Any], own: str, visible: str,
    count: int, local_rank: int, expected: int,
) -> None:
    monkeypatch.setenv("CAIRN_GPU_IDS", own)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    gpus["count"] = count
    device = _setup(NodeContext(local_rank=local_rank, local_world_size=2))
    assert device == torch.device("cuda", expected)
    assert gpus["set_device"] == torch.device("cuda", expected)
    assert gpus["init"]["backend"] == "nccl"
    assert (gpus["init"]["rank"], gpus["init"]["world_size"]) == (local_rank, 2)


def test_a_ray_worker_whose_gpu_is_not_visible_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch, gpus: dict[str, Any],
) -> None:
    monkeypatch.setenv("CAIRN_GPU_IDS", "3")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    gpus["count"] = 2
    with pytest.raises(cairn.ConfigError, match=r"Rank 1 was given GPU 3 by Ray, which "
                                                r"CUDA_VISIBLE_DEVICES='0,1' does not name"):
        _setup(NodeContext(local_rank=1, local_world_size=2))
    assert "init" not in gpus


def test_the_local_backend_puts_each_local_rank_on_its_gpu(gpus: dict[str, Any]) -> None:
    gpus["count"] = 8
    assert _setup(NodeContext(local_rank=3, local_world_size=8)) == torch.device("cuda", 3)
    assert gpus["set_device"] == torch.device("cuda", 3)


def test_the_local_backend_refuses_more_workers_than_gpus(gpus: dict[str, Any]) -> None:
    gpus["count"] = 1
    with pytest.raises(cairn.ConfigError, match=r"ScalingConfig\(num_workers=2, use_gpu=True\) "
                                                r"on a machine with 1 CUDA device\(s\)"):
        _setup(NodeContext(local_rank=1, local_world_size=2))
    assert "init" not in gpus
