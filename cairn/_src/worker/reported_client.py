"""``get_all_reported_checkpoints()``: the worker's side.

:class:`ReportedCheckpointsClient` sends a request naming the last report this rank made
and waits for the answer of :mod:`cairn._src.controller.reported_service`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from cairn._src.checkpoint.reported import (
    CheckpointConsistencyMode,
    ReportedCheckpoint,
    ReportedCheckpointStatus,
    check_timeout,
)
from cairn._src.checkpoint.views import checkpoint_from_view
from cairn._src.storage.options import StorageOptions
from cairn._src.wire.messages import ReportedCheckpointsReply, ReportedCheckpointsRequest


class ReportedCheckpointsClient:
    """The worker side; thread-safe."""

    def __init__(self, rank: int, send: Callable[[object], None],
                 last_index: Callable[[], int],
                 options: StorageOptions | None = None) -> None:
        self._rank = rank
        # What the checkpoints handed out are restored with (the session's).
        self._options = options or StorageOptions()
        self._send = send
        self._last_index = last_index
        self._lock = threading.Lock()
        self._next_id = 1
        self._waiting: dict[int, tuple[threading.Event, list[ReportedCheckpointsReply]]] = {}
        self._stopped: BaseException | None = None

    def get_all(self, consistency_mode: object, timeout_s: object) -> list[ReportedCheckpoint]:
        mode = CheckpointConsistencyMode.parse(consistency_mode)
        timeout = check_timeout(timeout_s)
        event = threading.Event()
        box: list[ReportedCheckpointsReply] = []
        with self._lock:
            if self._stopped is not None:
                raise self._stopped
            request_id = self._next_id
            self._next_id += 1
            self._waiting[request_id] = (event, box)
        self._send(ReportedCheckpointsRequest(self._rank, request_id, self._last_index(),
                                              mode.value, timeout))
        # The controller answers at timeout_s at the latest (or fails the attempt).
        event.wait()
        if not box:
            assert self._stopped is not None
            raise self._stopped
        return [ReportedCheckpoint(checkpoint_from_view(view)._with_options(self._options),
                                   dict(view.metrics),
                                   ReportedCheckpointStatus(status))
                for view, status in box[0].checkpoints]

    def stop(self, error: BaseException) -> None:
        """The attempt is stopping: every call waiting (and every later one) raises
        ``error``."""
        with self._lock:
            self._stopped = error
            waiting, self._waiting = list(self._waiting.values()), {}
        for event, _ in waiting:
            event.set()

    def on_reply(self, reply: ReportedCheckpointsReply) -> None:
        with self._lock:
            waiting = self._waiting.pop(reply.request_id, None)
        if waiting is not None:
            waiting[1].append(reply)
            waiting[0].set()
