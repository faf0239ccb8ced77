"""``TorchTrainer`` on a real 3-node Ray cluster: ranks on several nodes meet at rank 0's
node, on a port free there, not at the driver's loopback address."""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable
from typing import Any

import pytest

import cairn
from cairn import ScalingConfig
from cairn.torch import TorchTrainer

from . import cluster_workloads
from .conftest import RayCluster

pytestmark = pytest.mark.slow


def _read(scratch: str, name: str) -> Any:
    with open(os.path.join(scratch, name)) as f:
        return json.load(f)


def test_ranks_on_several_nodes_rendezvous_at_rank_zeros_node(
    cluster: RayCluster, run_config: Callable[..., cairn.RunConfig], scratch: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="cairn")
    TorchTrainer(cluster_workloads.torch_rendezvous, train_loop_config={"scratch": scratch},
                 scaling_config=ScalingConfig(num_workers=2, backend="ray"),
                 run_config=run_config()).fit()
    seen = [_read(scratch, f"rendezvous_{rank}") for rank in (0, 1)]
    # One CPU per node: the two ranks run on two nodes.
    assert seen[0]["node_id"] != seen[1]["node_id"]
    assert seen[0]["sum"] == seen[1]["sum"] == 3.0
    # Both joined rank 0's address and port, not what the driver chose for one machine.
    assert seen[0]["master"] == seen[1]["master"]
    host, port = seen[0]["master"]
    assert host == seen[0]["node_address"]
    driver = re.search(r"Attempt 0: torch.distributed rendezvous at [\d.]+:(\d+)", caplog.text)
    assert driver is not None and port != driver.group(1)
