"""Whether every worker sees the run's storage: a marker the driver writes, workers read.

Before the first attempt, the driver writes ``<run>/_cairn_storage_check.json`` with a
random token; the token travels in each worker's setup, and the worker reads the marker
back before the train function starts. A worker that does not find it, cannot read it,
or finds another token (the same path names another directory on its node) fails the
run at once with a :class:`ConfigError` that names its node and the path, and says how
to use storage every node shares. A restart would only repeat it, so it is fatal.

The marker is rewritten by every driver session and removed when the session ends; a
driver killed on the spot leaves it behind, and the next session replaces it. Its name
starts with ``_cairn``, which user checkpoint names cannot.
"""

from __future__ import annotations

import json
import logging
import secrets
import socket
import sys
import time

from cairn._src.errors import CairnError, CheckpointNotFoundError, ConfigError
from cairn._src.storage.fileio import delete_file, read_bytes, write_bytes_atomic
from cairn._src.storage.location import StorageLocation
from cairn._src.storage.retry import RetryPolicy

logger = logging.getLogger(__name__)

MARKER_NAME = "_cairn_storage_check.json"
MARKER_VERSION = 1
_MAX_MARKER_BYTES = 4096
# A shared file system may show a file written on another node a moment late (attribute
# caches): a missing or stale marker is looked at again for about two seconds.
_RECHECK_DELAYS_S = (0.25, 0.5, 1.0)


def write_storage_marker(run: StorageLocation, retry: RetryPolicy) -> str:
    """Write the marker into the run directory; the token for the workers' setup."""
    token = secrets.token_hex(16)
    body = {"version": MARKER_VERSION, "token": token, "written_at": time.time(),
            "written_by": socket.gethostname()}
    write_bytes_atomic(run.join(MARKER_NAME), json.dumps(body).encode(), retry)
    return token


def remove_storage_marker(run: StorageLocation, retry: RetryPolicy) -> None:
    """Remove the marker at the end of a session (a failure is logged, not raised)."""
    try:
        delete_file(run.join(MARKER_NAME), retry)
    except CheckpointNotFoundError:
        pass
    except Exception as exc:
        logger.warning("Could not remove the storage check marker %s: %s",
                       run.join(MARKER_NAME).display(), exc)


def check_storage_marker(run: StorageLocation, token: str, retry: RetryPolicy) -> None:
    """Raise :class:`ConfigError` unless this process reads the driver's marker back.

    The message names the node, not the rank: the controller groups the ranks that fail
    the same way ("[ranks 0, 1] ...")."""
    location = run.join(MARKER_NAME)
    problem = _marker_problem(location, token, retry)
    for delay in _RECHECK_DELAYS_S:
        if problem is None:
            return
        time.sleep(delay)
        problem = _marker_problem(location, token, retry)
    if problem is None:
        return
    raise ConfigError(
        f"A worker on node {describe_node()} cannot see the run's storage: the "
        f"driver wrote {location.display()} before training, and here {problem}. Every "
        "worker must reach the storage the driver uses. On a cluster, a local path works "
        "only when every node shares it at the same path (an NFS mount, for example); "
        "otherwise use a URI every node can reach (s3://bucket/prefix, gs://bucket/prefix), "
        "or a custom scheme registered on every node (install the package that registers "
        "it through the 'cairn.storage' entry point on each node), with credentials each "
        "node can find."
    )


def _marker_problem(location: StorageLocation, token: str, retry: RetryPolicy) -> str | None:
    try:
        data = read_bytes(location, retry, limit=_MAX_MARKER_BYTES)
    except CheckpointNotFoundError:
        return "it does not exist"
    except CairnError as exc:
        return f"it cannot be read ({exc})"
    try:
        body = json.loads(data)
    except (ValueError, RecursionError):
        # RecursionError: JSON nested deeper than the parser goes (the path names another
        # directory on this node, holding a file of that name the driver never wrote).
        return "it is not the JSON the driver wrote"
    if not isinstance(body, dict) or body.get("version") != MARKER_VERSION:
        return "it is not the marker the driver wrote"
    if body.get("token") != token:
        return ("it holds another token: the path names a different directory on this "
                "node, or another driver wrote it since")
    return None


def describe_node() -> str:
    """This machine for an error message: host name, and Ray's node id and address in a
    Ray worker."""
    name = socket.gethostname()
    ray = sys.modules.get("ray")
    if ray is None:
        return name
    try:
        if not ray.is_initialized():
            return name
        node_id = ray.get_runtime_context().get_node_id()
        address = ray.util.get_node_ip_address()
    except Exception:
        return name
    return f"{name} (Ray node {node_id}, {address})"
