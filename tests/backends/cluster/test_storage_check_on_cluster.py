"""Storage one node of the cluster cannot see fails the run at once, naming that node.

The nodes of a ``cluster_utils`` cluster share this machine's file system, so a node
that does not see the run's storage is played by ``nodeview://``: a scheme that is the local disk
everywhere except on a node started with $CAIRN_TEST_NODE_VIEW pointing at an empty
directory (its raylet's environment, which its actors inherit).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import cairn
from cairn import FailureConfig, RunConfig, ScalingConfig, Trainer
from cairn._src.run.storage_check import MARKER_NAME
from cairn.storage import register_scheme, unregister_scheme

from . import storage_workloads
from .conftest import NODE_ARGS, RayCluster

pytestmark = pytest.mark.slow


@pytest.fixture
def blind_node(cluster: RayCluster, tmp_path: Path) -> Iterator[Any]:
    """One of the cluster's three nodes sees an empty directory under ``nodeview://``."""
    register_scheme("nodeview", storage_workloads.node_view_store, overwrite=True)
    empty = tmp_path / "blind_node_root"
    empty.mkdir()
    cluster.cluster.remove_node(next(iter(cluster.cluster.worker_nodes)))
    node = cluster.cluster.add_node(
        **NODE_ARGS, env_vars={storage_workloads.VIEW_ENV: str(empty)})
    cluster.cluster.wait_for_nodes()
    try:
        yield node
    finally:
        cluster.cluster.remove_node(node)
        unregister_scheme("nodeview")


def test_storage_one_node_cannot_see_fails_the_run_at_once_naming_the_node(
    blind_node: Any, tmp_path: Path, scratch: str,
) -> None:
    storage = "nodeview://" + str(tmp_path / "storage")
    config = RunConfig(name="run", storage_path=storage,
                       failure_config=FailureConfig(max_failures=3))
    with pytest.raises(cairn.TrainingFailedError) as caught:
        # SPREAD over three nodes of one CPU: one worker on each, the blind node's too.
        Trainer(storage_workloads.note_node_and_hold, train_loop_config={"scratch": scratch},
                scaling_config=ScalingConfig(num_workers=3, backend="ray",
                                             placement_strategy="SPREAD"),
                run_config=config).fit()
    message = str(caught.value)
    marker = f"{storage}/run/{MARKER_NAME}"
    found = re.search(r"\[rank (\d)\] ConfigError: A worker on node (\S+) \(Ray node "
                      r"([0-9a-f]+), ([0-9.]+)\) cannot see the run's storage: the driver "
                      rf"wrote {re.escape(marker)} before training, and here it does not "
                      r"exist\.", message)
    assert found is not None, message
    assert found.group(3) == blind_node.node_id
    assert "a custom scheme registered on every node" in message
    # Only the blind node's rank failed; its train function never started, and the run
    # was not restarted (a restart would only fail the same way).
    assert re.findall(r"^\[ranks? [\d, ]+\]", message, re.MULTILINE) == [
        f"[rank {found.group(1)}]"], message
    started = {json.load(open(os.path.join(scratch, name))) for name in os.listdir(scratch)
               if name.startswith("started_") and not name.endswith(".tmp")}
    assert blind_node.node_id not in started
    index = json.loads((tmp_path / "storage" / "run" / "cairn_run.json").read_text())
    assert index["attempts"] == 1
    assert not (tmp_path / "storage" / "run" / MARKER_NAME).exists()
