"""A real 3-node Ray cluster on this machine, started once for this directory.

``ray.cluster_utils.Cluster``: a head node and two more, each with one CPU and a small
object store, so a run of 2 or 3 workers spreads over several nodes and the loss of one
node is the loss of a worker. The test process connects to it as the driver; drivers run
as subprocesses find it through ``RAY_ADDRESS``. All nodes share this machine's file
system: local storage paths are shared storage here.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The workloads and checks of the local backend's suites, reused on the cluster.
for folder in ("fault", "train", "support", "torch"):
    path = os.path.join(TESTS, folder)
    if path not in sys.path:
        sys.path.insert(0, path)

NODE_ARGS: dict[str, Any] = {"num_cpus": 1, "object_store_memory": 80 * 1024 * 1024}
NUM_NODES = 3


@dataclass
class RayCluster:
    cluster: Any
    address: str

    def alive_nodes(self) -> list[Any]:
        return list(self.cluster.list_all_nodes())

    def worker_node(self, node_id: str) -> Any:
        """The cluster's node with ``node_id``; never the head (removing it ends the cluster)."""
        for node in self.cluster.worker_nodes:
            if node.node_id == node_id:
                return node
        raise LookupError(f"{node_id} is not a worker node of the cluster")

    def add_node(self) -> Any:
        node = self.cluster.add_node(**NODE_ARGS)
        self.cluster.wait_for_nodes()
        return node

    def restore(self) -> None:
        """Back to NUM_NODES alive nodes, after a test removed some."""
        while len(self.alive_nodes()) < NUM_NODES:
            self.add_node()


@pytest.fixture(scope="package")
def ray_cluster() -> Iterator[RayCluster]:
    if ray.is_initialized():
        ray.shutdown()
    cluster = cluster_utils.Cluster(
        initialize_head=True, head_node_args={**NODE_ARGS, "include_dashboard": False})
    for _ in range(NUM_NODES - 1):
        cluster.add_node(**NODE_ARGS)
    cluster.wait_for_nodes()
    saved = os.environ.get("RAY_ADDRESS")
    os.environ["RAY_ADDRESS"] = cluster.address
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        yield RayCluster(cluster, cluster.address)
    finally:
        ray.shutdown()
        cluster.shutdown()
        if saved is None:
            os.environ.pop("RAY_ADDRESS", None)
        else:
            os.environ["RAY_ADDRESS"] = saved


@pytest.fixture
def cluster(ray_cluster: RayCluster) -> Iterator[RayCluster]:
    """The package's cluster, at full size before and after the test."""
    ray_cluster.restore()
    yield ray_cluster
    ray_cluster.restore()
