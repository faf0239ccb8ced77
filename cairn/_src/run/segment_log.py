"""An append-only log of JSON records on any storage, with flat cost per record.

Object stores cannot append, so the log is a sequence of segment objects
(``<dir>/segment_000000.jsonl``, ...). Records are buffered in memory and
:meth:`SegmentLog.flush` rewrites only the open segment, which holds at most
``records_per_segment`` records: the cost of a flush is bounded however long the run,
and a crash loses at most the records not yet flushed. Used for the metrics history and
the goodput event log.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Iterator
from typing import Any

from cairn._src.storage.fileio import list_dir_names, read_bytes, write_bytes_atomic
from cairn._src.storage.location import StorageLocation
from cairn._src.storage.retry import RetryPolicy

logger = logging.getLogger(__name__)

_SEGMENT = re.compile(r"^segment_(\d{6,})\.jsonl$")


def _segment_name(number: int) -> str:
    return f"segment_{number:06d}.jsonl"


def _segment_numbers(directory: StorageLocation, retry: RetryPolicy) -> list[int]:
    numbers = []
    for name in list_dir_names(directory, retry):
        match = _SEGMENT.match(name)
        if match:
            numbers.append(int(match.group(1)))
    return sorted(numbers)


def _parse_segment(data: bytes, where: str) -> Iterator[dict[str, Any]]:
    for line_number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            # A torn last line from a crash mid-write on a backend without atomic
            # writes: everything before it is intact.
            logger.warning("Skipping unreadable line %d of %s", line_number, where)
            continue
        if isinstance(record, dict):
            yield record


def read_log(directory: StorageLocation, retry: RetryPolicy) -> list[dict[str, Any]]:
    """Every record of the log, in order."""
    records: list[dict[str, Any]] = []
    for number in _segment_numbers(directory, retry):
        location = directory.join(_segment_name(number))
        try:
            data = read_bytes(location, retry)
        except FileNotFoundError:
            continue
        records.extend(_parse_segment(data, location.display()))
    return records


class SegmentLog:
    """Buffers records and persists them in bounded segments.

    Thread-safe: :meth:`append` may be called from any thread; :meth:`flush` writes what
    was appended so far and is serialized by a lock.
    """

    def __init__(
        self,
        directory: StorageLocation,
        retry: RetryPolicy,
        *,
        records_per_segment: int = 500,
    ) -> None:
        self._directory = directory
        self._retry = retry
        self._records_per_segment = records_per_segment
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._pending: list[bytes] = []
        self._open_lines: list[bytes] = []
        numbers = _segment_numbers(directory, retry)
        # Resuming a run starts a new segment: the old ones are never rewritten.
        self._segment = numbers[-1] + 1 if numbers else 0

    def append(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":"), default=_json_default).encode()
        with self._lock:
            self._pending.append(line)

    @property
    def dirty(self) -> bool:
        with self._lock:
            return bool(self._pending)

    def flush(self) -> None:
        with self._flush_lock:
            with self._lock:
                pending, self._pending = self._pending, []
            while pending:
                room = self._records_per_segment - len(self._open_lines)
                lines = self._open_lines + pending[:room]
                data = b"\n".join(lines) + b"\n"
                try:
                    write_bytes_atomic(
                        self._directory.join(_segment_name(self._segment)), data, self._retry
                    )
                except BaseException:
                    # Nothing is lost: the records go back in front of newer ones.
                    with self._lock:
                        self._pending = pending + self._pending
                    raise
                self._open_lines = lines
                pending = pending[room:]
                if len(self._open_lines) >= self._records_per_segment:
                    self._segment += 1
                    self._open_lines = []


def _json_default(value: Any) -> Any:
    item = getattr(value, "item", None)
    if callable(item):
        return item()
    return repr(value)
