"""An append-only log of JSON records on any storage, with flat cost per record.

Object stores cannot append, so the log is a sequence of segment objects
(``<dir>/segment_000000.jsonl``, ...). Records are buffered in memory and
:meth:`SegmentLog.flush` rewrites only the open segment, which holds at most
``records_per_segment`` records and :data:`MAX_SEGMENT_BYTES` bytes (a larger record
alone): the cost of a flush is bounded however long the run, every segment stays within
what readers take, and a crash loses at most the records not yet flushed. A record not
yet in a closed segment can be withdrawn (:meth:`SegmentLog.withdraw`): the event that a
failed flush could not make durable, when its emitter gives up what it announced. Used
for the metrics history and the goodput event log.

Two writers of one log never write the same segment: a driver that lost the run's lease
(paused past its ttl, judged dead, taken over) may flush until it next checks the fence,
and on object stores a write replaces a whole object. A new driver starts above every
segment it lists, which covers what the old one had written by then, but not a segment the
old one starts later, nor one whose write was under way (retried through an outage, the
process paused mid-flush). So a writer starts each segment by claiming its number: it
writes ``_cairn_claim.segment_NNNNNN.jsonl.<its 32 hex digits>`` (a name no other writer
uses), then lists, and takes the number only when no segment and no other writer's claim
holds it or a later one; otherwise it tries the number after the highest it saw. Of two
writers claiming one number, the one that lists last sees the other's claim, so at most one
takes it, with no exclusive create (which object stores lack), only a listing that shows
what was written before it (as the start of a log already needs). The claim is deleted once
the segment is written, which holds the number from then on. A claim left by a writer
killed in between is ignored by readers and skipped by writers. Starting a segment (once
per ``records_per_segment`` records) costs the claim's write and deletion and one listing.
"""

from __future__ import annotations

import io
import json
import logging
import re
import secrets
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from cairn._src.errors import CheckpointDamagedError, ConfigError, ManifestError, StorageError
from cairn._src.run import schema
from cairn._src.run.layout import EVENTS_DIR, METRICS_DIR
from cairn._src.storage.fileio import (
    delete_file,
    is_local_link,
    list_dir_names,
    read_bytes,
    write_bytes_atomic,
)
from cairn._src.storage.location import StorageLocation
from cairn._src.storage.retry import RetryPolicy

logger = logging.getLogger(__name__)

# A segment's number: ASCII digits, six or more (zero-padded to six), at most twelve. A
# log rolls a segment every 500 records by default, so no run comes near 10**12 segments;
# a longer number (``segment_<199 ones>.jsonl``) is not a name Cairn wrote, and numbering
# after it would give the next segment a name longer than file systems take.
MAX_SEGMENT_NUMBER = 10**12 - 1
_SEGMENT = re.compile(r"segment_([0-9]{6,12})\.jsonl")
# What looks like a segment (and is reported when it is not one): the names a peer or an
# older Cairn could mean as segments, not the temporary files of an atomic write.
_SEGMENT_LIKE = re.compile(r"segment_.*\.jsonl", re.DOTALL)
_SHOWN = 3
# The most bytes a segment holds unless one record alone is larger: far below what a
# reader takes (MAX_SMALL_FILE_BYTES, which skips a larger segment whole, every record in
# it), so that large metrics (a histogram per report) never make a segment unreadable,
# and a bound on what one flush rewrites.
MAX_SEGMENT_BYTES = 16 << 20
# The most records a reader takes from one segment: the writer closes one at
# ``records_per_segment`` (500) records, so only a planted segment holds more.
MAX_SEGMENT_RECORDS = 10_000
# A writer's claim of the segment it starts: the segment's name and the writer's session
# (32 lowercase hex digits). Reserved by its prefix (``_cairn``), never a segment's name.
_CLAIM = re.compile(r"_cairn_claim\.(segment_[0-9]{6,12}\.jsonl)\.([0-9a-f]{32})")
# How many numbers a writer tries in one flush when other writers claim the same ones each
# time (two writers that list in lockstep both step aside); the records wait for the next.
_CLAIM_ATTEMPTS = 8


def _segment_name(number: int) -> str:
    return f"segment_{number:06d}.jsonl"


def _claim_name(number: int, session: str) -> str:
    return f"_cairn_claim.{_segment_name(number)}.{session}"


def _number_held(name: str, session: str) -> int | None:
    """The segment number ``name`` holds against the writer ``session``: a segment's, or
    another writer's claim's (as Cairn names them); None for any other name."""
    if is_segment_name(name):
        return int(name[len("segment_"):-len(".jsonl")])
    match = _CLAIM.fullmatch(name)
    if match is None or match.group(2) == session or not is_segment_name(match.group(1)):
        return None
    return int(match.group(1)[len("segment_"):-len(".jsonl")])


def is_claim_name(name: str) -> bool:
    """Whether ``name`` is a writer's claim of a segment number, as Cairn writes it."""
    match = _CLAIM.fullmatch(name)
    return match is not None and is_segment_name(match.group(1))


def is_segment_name(name: str) -> bool:
    """Whether ``name`` is a segment's name as Cairn writes it (``_segment_name(n)`` for
    ``n`` up to :data:`MAX_SEGMENT_NUMBER`, ASCII digits)."""
    match = _SEGMENT.fullmatch(name)
    return match is not None and _segment_name(int(match.group(1))) == name


def _segment_numbers(directory: StorageLocation, retry: RetryPolicy, *,
                     claims: bool = False) -> list[int]:
    """The numbers of the segments in ``directory``, ascending (with ``claims``: and of
    every writer's claim of one).

    Only names Cairn writes count (``_segment_name(n)`` for ``n`` up to
    :data:`MAX_SEGMENT_NUMBER`, ASCII digits): other names that look like segments (other
    scripts' digits, leading zeros beyond six digits, too many digits) are ignored, with
    one warning per listing that counts them. A log directory that is a symbolic link on
    the local disk is refused (:class:`ManifestError`): it is not a directory this run
    wrote, and its records (another run's) must not be read or written as this run's.
    """
    if is_local_link(directory):
        raise ManifestError(
            f"The log {directory.display()} is a symbolic link: not a directory this run "
            "wrote, so its records are not read as this run's nor written to. Remove the "
            "link (what it points at is left as it is).")
    numbers = []
    foreign = []
    for name in list_dir_names(directory, retry):
        held = _number_held(name, "") if claims else None
        if is_segment_name(name):
            numbers.append(int(name[len("segment_"):-len(".jsonl")]))
        elif held is not None:
            numbers.append(held)
        elif _SEGMENT_LIKE.fullmatch(name):
            foreign.append(name)
    if foreign:
        shown = ", ".join(schema.short_repr(name) for name in foreign[:_SHOWN])
        logger.warning(
            "Ignoring %d names under %s that look like log segments but are not names Cairn "
            "writes (segment_NNNNNN.jsonl: 6 to 12 ASCII digits, zero-padded to 6): %s%s",
            len(foreign), directory.display(), shown, ", ..." if len(foreign) > _SHOWN else "")
    return sorted(numbers)


_LOG_HINT = "The record is skipped."
METRICS_RECORD = schema.Document(
    "metrics record",
    schema.Object(
        {
            "report_index": schema.Integer(minimum=1, maximum=schema.MAX_REPORT_INDEX),
            "attempt": schema.COUNT,
            "time": schema.TIME,
            "metrics": schema.USER_JSON,
            "checkpoint_dir_name": schema.DIR_NAME,
        },
        required=frozenset({"report_index", "metrics"}),
        noun="a metrics record (an object with 'report_index' and 'metrics')",
    ),
    hint=_LOG_HINT,
)
_OPTIONAL_TIME = schema.Nullable(schema.TIME)
EVENT_RECORD = schema.Document(
    "event record",
    schema.Object(
        {
            "type": schema.String(),
            "t": schema.TIME,
            "attempt": schema.COUNT,
            "rank": schema.COUNT,
            "ranks": schema.ListOf(schema.COUNT, noun="ranks (integers >= 0)"),
            "seconds": schema.TIME,
            "bytes": schema.COUNT,
            "index": schema.Nullable(schema.REPORT_INDEX),
            "dir_name": schema.DIR_NAME,
            "resume": schema.Nullable(schema.DIR_NAME),
            "kind": schema.String(),
            "reason": schema.String(empty=True),
            "last_commit_t": _OPTIONAL_TIME,
            "attempt_t": _OPTIONAL_TIME,
            "deadline_t": _OPTIONAL_TIME,
        },
        required=frozenset({"type", "t"}),
        noun="an event record (an object with 'type' and 't')",
    ),
    hint=_LOG_HINT,
)
_ANY_RECORD = schema.Document("log record", schema.Object({}, noun="a JSON object"),
                              hint=_LOG_HINT)
# The schema of a log follows from where the layout puts it.
_RECORD_SCHEMAS = {METRICS_DIR: METRICS_RECORD, EVENTS_DIR: EVENT_RECORD}


@dataclass
class _Skipped:
    """How many records a read skipped, and why the first was: a segment of millions of
    bad lines costs no memory per line."""

    count: int = 0
    first: str = ""

    def add(self, why: str) -> None:
        if not self.count:
            self.first = why
        self.count += 1


def _lines(data: bytes) -> Iterator[bytes]:
    """The lines of ``data`` as ``bytes.splitlines`` gives them, one at a time (a list of
    every line of a large segment would cost tens of bytes per line)."""
    for chunk in io.BytesIO(data):
        yield from chunk.splitlines()


def _parse_segment(
    data: bytes, where: str, document: schema.Document, skipped: _Skipped
) -> Iterator[dict[str, Any]]:
    taken = 0
    for line_number, line in enumerate(_lines(data), start=1):
        if not line.strip():
            continue
        at = f"{where} line {line_number}"
        try:
            record = schema.validate(
                schema.load_json(line, what=document.what, where=at), document, where=at
            )
        except ManifestError as exc:
            # A torn last line from a crash mid-write on a backend without atomic writes,
            # or a record someone else wrote: everything else is still usable.
            skipped.add(str(exc))
            continue
        if taken == MAX_SEGMENT_RECORDS:
            # Each record kept costs a reader far more than its bytes: a segment of many
            # tiny records (planted) would cost gigabytes.
            skipped.add(f"{where} holds more than {MAX_SEGMENT_RECORDS} records, which no "
                        "segment Cairn writes does: the records after them are skipped")
            return
        taken += 1
        yield record


def read_log(
    directory: StorageLocation,
    retry: RetryPolicy,
    *,
    document: schema.Document | None = None,
) -> list[dict[str, Any]]:
    """Every valid record of the log, in order.

    Each record is checked against ``document`` (by default the schema of the log the
    layout keeps in ``directory``: metrics or events). Records that are not valid JSON or
    do not match, and segments that cannot be read as a file Cairn wrote (a FIFO, a
    device, a directory, too large), are skipped, counted, and reported in one warning;
    an outage (any other :class:`StorageError`) is raised.
    """
    if document is None:
        document = _RECORD_SCHEMAS.get(directory.path.rstrip("/").rpartition("/")[2],
                                       _ANY_RECORD)
    records: list[dict[str, Any]] = []
    skipped = _Skipped()
    for number in _segment_numbers(directory, retry):
        location = directory.join(_segment_name(number))
        try:
            data = read_bytes(location, retry)
        except FileNotFoundError:
            continue
        except CheckpointDamagedError as exc:
            skipped.add(str(exc))
            continue
        records.extend(_parse_segment(data, location.display(), document, skipped))
    if skipped.count:
        logger.warning("Skipped %d unreadable or invalid records of %s; the first: %s",
                       skipped.count, directory.display(), skipped.first)
    return records


class SegmentLog:
    """Buffers records and persists them in bounded segments.

    Thread-safe: :meth:`append` may be called from any thread; :meth:`flush` writes what
    was appended so far and is serialized by a lock, as is :meth:`withdraw`.

    Each segment it writes is one no other writer of the log writes, before or after (see
    the module's docstring): a driver that lost the run's lease never replaces a segment
    of the driver that took the run over, nor the other way round.
    """

    def __init__(
        self,
        directory: StorageLocation,
        retry: RetryPolicy,
        *,
        records_per_segment: int = 500,
        durable: bool = False,
        fence: Callable[[], None] | None = None,
    ) -> None:
        if not 1 <= records_per_segment <= MAX_SEGMENT_RECORDS:
            raise ConfigError(f"records_per_segment={records_per_segment!r} must be from 1 "
                              f"to {MAX_SEGMENT_RECORDS}, the most a reader takes.")
        self._directory = directory
        self._retry = retry
        # The run lease's check (raises RunLeaseError once another driver holds the run),
        # made before each new segment: a driver that lost the run starts none, so none of
        # its records comes after the new driver's (whose readers take the last session's
        # end for the run's status).
        self._fence = fence
        self._records_per_segment = records_per_segment
        # Each flush fsynced (the run's storage_fsync): a record flushed before a
        # checkpoint exists (a validation's request, a reference's registration) outlives
        # a crash of the machine that the checkpoint outlives.
        self._durable = durable
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._pending: list[bytes] = []
        self._open_lines: list[bytes] = []
        self._open_bytes = 0
        # The open segment must be written again even with nothing pending: a failed write
        # may have left records there (a write kept whose answer was lost) that were
        # withdrawn since, or a record was withdrawn from it.
        self._rewrite_open = False
        # This writer's name in its claims; whether the open segment's number is claimed,
        # and its claim until the segment is written.
        self._session = secrets.token_hex(16)
        self._claimed = False
        self._claim: StorageLocation | None = None
        numbers = _segment_numbers(directory, retry, claims=True)
        # Resuming a run starts a new segment, above every other writer's claim too: the
        # old ones are never rewritten.
        self._segment = numbers[-1] + 1 if numbers else 0
        if self._segment > MAX_SEGMENT_NUMBER:
            # Only a planted segment_999999999999.jsonl (or a claim of it) gets here:
            # numbering after it would write a segment that no reader counts.
            raise _last_number_error(directory, f"{_segment_name(numbers[-1])} or a writer's "
                                     "claim of it")

    def append(self, record: dict[str, Any]) -> None:
        line = _encode(record)
        with self._lock:
            self._pending.append(line)

    @property
    def dirty(self) -> bool:
        """Whether :meth:`flush` has something to write."""
        with self._lock:
            return bool(self._pending) or self._rewrite_open

    def withdraw(self, record: dict[str, Any]) -> bool:
        """Take back ``record``, appended earlier, so that no flush writes it from now on.

        True when it is withdrawn: it was not written yet (a flush that failed may have
        written it all the same, as a store that loses a write's answer does), or only to
        the open segment. Either way the next :meth:`flush` rewrites the open segment
        without it, and :attr:`dirty` is true until then; a crash before that flush can
        leave it in the log. False when a flush already wrote it to a closed segment,
        which is never rewritten: it stays in the log. Waits for a flush in progress.
        """
        line = _encode(record)
        with self._flush_lock:
            with self._lock:
                if _remove_last(self._pending, line):
                    return True
                if _remove_last(self._open_lines, line):
                    self._open_bytes -= len(line) + 1
                    self._rewrite_open = True
                    return True
            return False

    def flush(self) -> None:
        with self._flush_lock:
            with self._lock:
                pending, self._pending = self._pending, []
            while pending or self._rewrite_open:
                room = self._records_per_segment - len(self._open_lines)
                lines, size = list(self._open_lines), self._open_bytes
                for line in pending[:room]:
                    if lines and size + len(line) + 1 > MAX_SEGMENT_BYTES:
                        break
                    lines.append(line)
                    size += len(line) + 1
                taken = len(lines) - len(self._open_lines)
                if taken or self._rewrite_open:
                    data = b"\n".join(lines) + b"\n"
                    try:
                        if not self._claimed:
                            self._claim_segment()
                        write_bytes_atomic(
                            self._directory.join(_segment_name(self._segment)), data,
                            self._retry, durable=self._durable,
                        )
                    except BaseException:
                        # Nothing is lost: the records go back in front of newer ones. The
                        # write may have been kept all the same: until the open segment is
                        # written again, it may hold records withdrawn since (a number
                        # not claimed yet was never written).
                        with self._lock:
                            self._pending = pending + self._pending
                            self._rewrite_open = self._claimed
                        raise
                    with self._lock:
                        self._rewrite_open = False
                    if self._claim is not None:
                        # The segment holds its number now; a claim left by a failed
                        # deletion is ignored by readers and skipped by writers.
                        self._delete_claim(self._claim)
                        self._claim = None
                    self._open_lines, self._open_bytes = lines, size
                    pending = pending[taken:]
                # Records left over: the open segment is full (by count or by bytes).
                if pending or len(self._open_lines) >= self._records_per_segment:
                    self._segment += 1
                    self._claimed = False
                    self._open_lines, self._open_bytes = [], 0

    def _claim_segment(self) -> None:
        """Make the open segment's number this writer's: its own number, or the first one
        after every number other writers hold (see the module's docstring).

        A number once claimed stays this writer's, even when its first write fails: that
        write may land later, and the claim, kept until a write succeeds, keeps every other
        writer off the number meanwhile.
        """
        if self._fence is not None:
            self._fence()
        number, holder = self._segment, _segment_name(self._segment - 1)
        for _ in range(_CLAIM_ATTEMPTS):
            if number > MAX_SEGMENT_NUMBER:
                raise _last_number_error(self._directory, holder)
            claim = self._directory.join(_claim_name(number, self._session))
            write_bytes_atomic(claim, b"", self._retry)
            highest = -1
            for name in list_dir_names(self._directory, self._retry):
                held = _number_held(name, self._session)
                if held is not None and held > highest:
                    highest, holder = held, name
            if highest < number:
                self._segment, self._claimed, self._claim = number, True, claim
                return
            logger.warning(
                "Not starting %s in %s: %s holds that number or a later one (another writer "
                "of this log: a driver that lost the run's lease, or one killed as it started "
                "a segment); trying %s", _segment_name(number), self._directory.display(),
                holder, _segment_name(highest + 1))
            self._delete_claim(claim)  # nothing was written under this number
            number = highest + 1
        raise StorageError(
            f"Could not start a segment of the log {self._directory.display()}: another "
            f"writer claimed the same segment numbers {_CLAIM_ATTEMPTS} times in a row (a "
            "driver that lost the run's lease may still be running). The records stay "
            "buffered for the next flush."
        )

    def _delete_claim(self, claim: StorageLocation) -> None:
        try:
            delete_file(claim, self._retry)
        except Exception:
            logger.debug("Could not delete the segment claim %s", claim.display(),
                         exc_info=True)


def _last_number_error(directory: StorageLocation, holder: str) -> ManifestError:
    """A log whose ``holder`` (a segment, or a writer's claim of one) has the last number
    Cairn counts to: only a planted file gets there, and numbering after it would write a
    segment no reader counts."""
    return ManifestError(
        f"The log {directory.display()} holds {holder}, the last segment number Cairn "
        f"counts to ({MAX_SEGMENT_NUMBER}): it is not a file Cairn wrote. Remove it (and any "
        "other planted segment_*.jsonl or _cairn_claim.* there); the log's new records go "
        "after its last segment.")


def _encode(record: dict[str, Any]) -> bytes:
    return json.dumps(record, separators=(",", ":"), default=_json_default).encode()


def _remove_last(lines: list[bytes], line: bytes) -> bool:
    """Remove the last ``line`` of ``lines``; False when there is none."""
    for i in range(len(lines) - 1, -1, -1):
        if lines[i] == line:
            del lines[i]
            return True
    return False


def _json_default(value: Any) -> Any:
    item = getattr(value, "item", None)
    if callable(item):
        return item()
    return repr(value)
