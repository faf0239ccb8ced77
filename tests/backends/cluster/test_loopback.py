"""The test cluster binds to 127.0.0.1: no test traffic on the machine's network interface."""

from __future__ import annotations

import ray

from .conftest import RayCluster


def test_every_node_of_the_test_cluster_reports_the_loopback_address(
        cluster: RayCluster) -> None:
    assert cluster.address.startswith("127.0.0.1:"), cluster.address
    nodes = [node for node in ray.nodes() if node["Alive"]]
    assert len(nodes) >= 3
    assert {node["NodeManagerAddress"] for node in nodes} == {"127.0.0.1"}

    @ray.remote(num_cpus=0)
    def where() -> str:
        return str(ray.util.get_node_ip_address())

    assert set(ray.get([where.remote() for _ in range(4)])) == {"127.0.0.1"}
