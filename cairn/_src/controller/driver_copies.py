"""The driver's copies of each rank's small checkpoint files, for the rank that replaces it.

With ``FailureConfig(keep_survivors=True)`` a replaced rank restores the state its kept
peers hold in memory from them. What only the failed rank wrote (its RNG states and data
loader position: ``rank_<r>/rank_state.pt``, a few KiB) died with it, and was read from
storage. So each rank that keeps its snapshot in memory also sends the driver the bytes of
its smallest written files, up to :func:`~cairn._src.wire.messages.driver_copy_limit` in
all (``UploadedMessage.small_files``); :class:`DriverCopies` keeps those of the latest
committed checkpoint, and the restore plan of a replacement rank carries its predecessor's
(``RestorePlan.driver_files``). The replacement writes each only when its size and
checksum are the manifest's (``worker/memory_copy.py``); storage serves the rest.

Ownership: an observer of the run's event stream, called on the controller loop's thread
(``Uploaded`` and ``CheckpointCommitted`` are emitted there), and read there when the next
attempt is planned.
"""

from __future__ import annotations

import logging

from cairn._src.observe.driver_events import (
    CheckpointCommitted,
    CheckpointSkipped,
    CommitFailed,
    Uploaded,
    WorkerGroupStarted,
)
from cairn._src.observe.observer import ObservedEvent
from cairn._src.wire.messages import UploadedMessage, driver_copy_cost, driver_copy_limit

logger = logging.getLogger(__name__)


class DriverCopies:
    """Each rank's small files of the latest committed checkpoint (see the module
    docstring), and of the reports not committed yet."""

    def __init__(self) -> None:
        self._pending: dict[int, dict[int, dict[str, bytes]]] = {}
        self._committed_index: int | None = None
        self._committed: dict[int, dict[str, bytes]] = {}
        # Reports of this attempt that will not commit (skipped, failed): a rank's late
        # part of one is not kept.
        self._ended: set[int] = set()
        self._limit = driver_copy_limit(1)  # per rank, for this attempt's world size

    def notify(self, event: ObservedEvent) -> None:
        if isinstance(event, Uploaded):
            self._uploaded(event.message)
        elif isinstance(event, CheckpointCommitted):
            index = event.ready.index
            if self._committed_index is not None and index < self._committed_index:
                # Committed after a later report (its upload finished later): the later
                # one is the latest committed checkpoint, whose files are kept.
                return
            self._committed_index = index
            self._committed = self._pending.pop(index, {})
            for older in [i for i in self._pending if i < index]:
                del self._pending[older]
        elif isinstance(event, WorkerGroupStarted):
            # The attempt before ended with its commits: what it left pending never
            # commits (a report index written again is uploaded again).
            self._pending.clear()
            self._ended.clear()
            self._limit = driver_copy_limit(event.world_size)
        elif isinstance(event, (CommitFailed, CheckpointSkipped)):
            index = event.ready.index if isinstance(event, CommitFailed) else event.index
            self._pending.pop(index, None)
            self._ended.add(index)

    def _uploaded(self, message: UploadedMessage) -> None:
        files = message.small_files
        if (not files or message.index in self._ended
                or (self._committed_index is not None
                    and message.index <= self._committed_index)):
            return
        if (not all(isinstance(k, str) and isinstance(v, bytes) for k, v in files.items())
                or sum(driver_copy_cost(k, len(v)) for k, v in files.items()) > self._limit):
            logger.warning("Rank %d sent small files that are not kept (%d files, over %d "
                           "bytes or not bytes)", message.rank, len(files), self._limit)
            return
        self._pending.setdefault(message.index, {})[message.rank] = dict(files)

    def files(self, report_index: int, rank: int) -> dict[str, bytes]:
        """The small files ``rank`` wrote for the checkpoint of ``report_index``, when it
        is the latest committed one ({} otherwise)."""
        if report_index != self._committed_index:
            return {}
        return dict(self._committed.get(rank, {}))
