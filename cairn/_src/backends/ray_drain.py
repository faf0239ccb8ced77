"""The Ray backend's preemption notice: a drain of the worker's node.

Ray marks a node *draining* when the autoscaler (or ``ray drain-node``, or anything that
calls the GCS ``DrainNode`` RPC) announces that it will take the node away, with the
reclaim deadline when there is one; a spot or preemptible instance's reclaim is one.
Ray Train 2.60 polls the same state (``ray._private.state.state.get_draining_nodes()``,
``{node_id: deadline_ms}``, ``0``: no deadline) from one watcher actor; here one worker
of each node (the backend picks it: local rank 0, or the replacement of a replaced
watcher) polls for its own node, every :data:`DRAIN_POLL_S`
seconds (``CAIRN_DRAIN_POLL_S`` in ``RunConfig(worker_env=...)`` changes it), and sends
the controller one notice (``worker/preemption.py``).
"""

from __future__ import annotations

import logging
import math
import threading

import ray

from cairn._src.wire.preemption import DRAIN_SOURCE
from cairn._src.worker.preemption import NoticeSource

logger = logging.getLogger(__name__)

DRAIN_POLL_S = 1.0
# Seconds between polls, from the worker's environment (RunConfig(worker_env=...)).
DRAIN_POLL_ENV = "CAIRN_DRAIN_POLL_S"


def drain_poll_s(env: dict[str, str]) -> float:
    """The poll interval ``env`` sets (:data:`DRAIN_POLL_ENV`), else :data:`DRAIN_POLL_S`."""
    raw = env.get(DRAIN_POLL_ENV, "")
    try:
        value = float(raw) if raw.strip() else DRAIN_POLL_S
    except ValueError:
        value = math.nan
    if not value > 0:
        logger.warning("%s=%r is not a number of seconds > 0; polling every %gs",
                       DRAIN_POLL_ENV, raw, DRAIN_POLL_S)
        return DRAIN_POLL_S
    return value


class DrainNotice(NoticeSource):
    """Polls Ray's draining nodes on a ``cairn-drain-watch`` thread until ``node_id``
    is among them (or :meth:`close`)."""

    def __init__(self, node_id: str, poll_s: float = DRAIN_POLL_S) -> None:
        super().__init__(DRAIN_SOURCE)
        self._node_id = node_id
        self._poll_s = poll_s
        self._stop = threading.Event()
        threading.Thread(target=self._watch, name="cairn-drain-watch", daemon=True).start()

    def _watch(self) -> None:
        while not self._stop.wait(self._poll_s):
            try:
                draining = ray._private.state.state.get_draining_nodes()
            except Exception as exc:  # a GCS hiccup: the next poll tries again
                logger.debug("Could not read Ray's draining nodes: %s", exc)
                continue
            if self._node_id in draining:
                deadline_ms = int(draining[self._node_id]) or None
                self.deliver(deadline_ms)
                return

    def close(self) -> None:
        self._stop.set()
