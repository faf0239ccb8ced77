"""``barrier()`` and ``broadcast_from_rank_zero(data)``: the worker's side.

The n-th collective call of every rank is collective n. :class:`WorkerCollectives` sends
one ``CollectiveMessage`` on the worker's connection (after the reports it made before, on
the same ordered channel) and waits for the release the controller's
:mod:`cairn._src.controller.collective_service` sends once every rank arrived.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import cloudpickle

from cairn._src.errors import ReportError
from cairn._src.wire.messages import (
    BARRIER,
    BROADCAST,
    CollectiveMessage,
    CollectiveReleaseMessage,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Above this, a broadcast is logged: every rank receives its own copy through the driver.
_LARGE_BROADCAST_BYTES = 1 << 20


class WorkerCollectives:
    """The worker side. ``send`` puts a message on the worker's connection; thread-safe."""

    def __init__(self, rank: int, send: Callable[[object], None],
                 report_count: Callable[[], int]) -> None:
        self._rank = rank
        self._send = send
        self._report_count = report_count
        self._lock = threading.Lock()
        self._next_seq = 1
        self._waiting: dict[int, tuple[threading.Event, list[bytes | None]]] = {}
        self._stopped: BaseException | None = None

    def barrier(self) -> None:
        self._call(BARRIER, None)

    def broadcast_from_rank_zero(self, data: T) -> T:
        payload: bytes | None = None
        if self._rank == 0:
            try:
                payload = bytes(cloudpickle.dumps(data))
            except Exception as exc:
                raise ReportError(
                    f"broadcast_from_rank_zero(data={_short(data)}) cannot be pickled "
                    f"({type(exc).__name__}: {exc}); broadcast picklable data (numbers, "
                    "strings, lists and dicts of them, small objects)."
                ) from exc
            if len(payload) > _LARGE_BROADCAST_BYTES:
                logger.warning("broadcast_from_rank_zero() sends %d bytes to every rank "
                               "through the driver; it is meant for small data",
                               len(payload))
        received = self._call(BROADCAST, payload)
        if self._rank == 0:
            return data
        value: T = cloudpickle.loads(received) if received is not None else None  # type: ignore[assignment]
        return value

    def _call(self, kind: str, payload: bytes | None) -> bytes | None:
        event = threading.Event()
        box: list[bytes | None] = []
        with self._lock:
            if self._stopped is not None:
                raise self._stopped
            seq = self._next_seq
            self._next_seq += 1
            self._waiting[seq] = (event, box)
        self._send(CollectiveMessage(self._rank, seq, kind, self._report_count(), payload))
        # No deadline here: the controller fails the attempt (and so ends this process, or
        # stops this call) when the other ranks do not arrive within the collective timeout.
        event.wait()
        if not box:
            assert self._stopped is not None
            raise self._stopped
        return box[0]

    def stop(self, error: BaseException) -> None:
        """The attempt is stopping (another rank failed): every call waiting, and every
        later one, raises ``error``."""
        with self._lock:
            self._stopped = error
            waiting, self._waiting = list(self._waiting.values()), {}
        for event, _ in waiting:
            event.set()

    def on_release(self, message: CollectiveReleaseMessage) -> None:
        with self._lock:
            waiting = self._waiting.pop(message.seq, None)
        if waiting is not None:
            event, box = waiting
            box.append(message.data)
            event.set()


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."

