"""A storage scheme whose view differs by node, and a train function, for the storage
check on the Ray cluster; the factory runs in the driver and in the actors."""

from __future__ import annotations

import json
import os
import threading
from typing import Any

import pyarrow.fs as pafs
import ray

import cairn

VIEW_ENV = "CAIRN_TEST_NODE_VIEW"


def node_view_store(uri: str) -> pafs.FileSystem:
    """``nodeview:///<absolute path>``: this machine's file system, except on a node whose
    processes have $CAIRN_TEST_NODE_VIEW set: there the path is looked up under that
    (empty) directory, as a path only some nodes mount would be."""
    root = os.environ.get(VIEW_ENV)
    if root is None:
        return pafs.LocalFileSystem()
    return pafs.SubTreeFileSystem(root, pafs.LocalFileSystem())


def note_node_and_hold(config: dict[str, Any]) -> None:
    """Each rank that starts notes its node, then waits until the group is torn down."""
    rank = cairn.get_context().get_world_rank()
    path = os.path.join(config["scratch"], f"started_{rank}")
    with open(path + ".tmp", "w") as f:
        json.dump(ray.get_runtime_context().get_node_id(), f)
    os.replace(path + ".tmp", path)
    threading.Event().wait()
