"""The typed events of a run's event log: one frozen dataclass per record type.

The controller (and the checkpoint manager and validations it drives) writes each event as
one JSON record of ``<run>/events``; :meth:`Event.to_record` gives that record, field for
field, so the format on storage is the one Cairn always wrote. Reading back goes the other
way: :func:`parse_event` checks a record against the event log's schema
(:data:`cairn._src.run.segment_log.EVENT_RECORD`, with the messages that name the file and
the field) and returns its type; :func:`read_events` reads a whole log so.

The log is untrusted and outlives versions of Cairn, so reading is lenient where the
readers always were: a field an older Cairn did not write is None (or its old default), a
value the schema does not cover and that has the wrong type (an ``errors`` entry that is
not an error, a ``status`` that is not a string) is dropped, and a record of a type this
Cairn does not know (a newer writer) is kept as :class:`UnknownEvent`, so that its time
still counts. (Plain dataclasses, not ``msgspec``: :mod:`cairn._src.run.schema` checks.)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from cairn._src.run import schema
from cairn._src.run.segment_log import EVENT_RECORD, read_log
from cairn._src.storage.location import StorageLocation
from cairn._src.storage.retry import RetryPolicy


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _object(value: object) -> dict[str, Any] | None:
    return dict(value) if isinstance(value, Mapping) else None


@dataclass(frozen=True)
class ErrorInfo:
    """One error as the event log keeps it: its type's name, the ranks and the message;
    ``frame`` (where it failed, ``{"file", "line", "function"}``, unchecked) only in the
    errors of a failure."""

    type: str
    ranks: tuple[int, ...]
    message: str
    frame: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)

    @staticmethod
    def parse(value: object) -> ErrorInfo | None:
        """The error ``value`` describes, or None when it is not one (untrusted input)."""
        if not isinstance(value, Mapping):
            return None
        kind, message, ranks = value.get("type"), value.get("message"), value.get("ranks", ())
        if not isinstance(kind, str) or not isinstance(message, str):
            return None
        if not isinstance(ranks, (list, tuple)):
            ranks = ()
        return ErrorInfo(kind, tuple(r for r in ranks if _is_int(r)), message,
                         _object(value.get("frame")))

    @property
    def rank(self) -> int | None:
        """The first failed rank, or None when the error is not a rank's (the driver's)."""
        return self.ranks[0] if self.ranks else None

    def as_dict(self) -> dict[str, Any]:
        return {"type": self.type, "ranks": list(self.ranks), "message": self.message}


def _errors(value: object) -> tuple[ErrorInfo, ...]:
    if not isinstance(value, (list, tuple)):
        return ()
    return tuple(e for e in map(ErrorInfo.parse, value) if e is not None)


@dataclass(frozen=True, kw_only=True)
class Event:
    """One record of the event log; ``t`` is a Unix time. Subclasses name their ``TYPE``.

    Every record read back from storage has a finite ``t``; it is None only in an event
    :func:`as_events` built from a record in memory that had none.
    """

    TYPE: ClassVar[str] = ""
    t: float | None

    @property
    def type(self) -> str:
        return self.TYPE

    def to_record(self) -> dict[str, Any]:
        """The record as the event log stores it."""
        return {"type": self.type, "t": self.t}

    @classmethod
    def _from_record(cls, record: Mapping[str, Any]) -> Event:
        return cls(t=record.get("t"))


@dataclass(frozen=True, kw_only=True)
class SessionStart(Event):
    """A driver started working on the run (``fit()``)."""

    TYPE: ClassVar[str] = "session_start"


@dataclass(frozen=True, kw_only=True)
class SessionEnd(Event):
    """A driver stopped: ``status`` is ``finished``, ``failed`` (with ``error``) or
    ``interrupted``; None in logs written before it said so (or not a string)."""

    TYPE: ClassVar[str] = "session_end"
    status: str | None = None
    error: ErrorInfo | None = None

    def to_record(self) -> dict[str, Any]:
        record: dict[str, Any] = {"type": self.type, "t": self.t}
        if self.status is not None:
            record["status"] = self.status
        if self.error is not None or self.status == "failed":
            record["error"] = None if self.error is None else self.error.as_dict()
        return record

    @classmethod
    def _from_record(cls, record: Mapping[str, Any]) -> Event:
        return cls(t=record.get("t"), status=_text(record.get("status")),
                   error=ErrorInfo.parse(record.get("error")))


@dataclass(frozen=True, kw_only=True)
class AttemptStart(Event):
    """A worker group was started; ``resume`` is the checkpoint it resumes from."""

    TYPE: ClassVar[str] = "attempt_start"
    attempt: int | None = None
    resume: str | None = None
    # FailureConfig(keep_survivors=True): the ranks whose processes run this attempt again
    # after the previous one failed, and the ranks started afresh (both empty otherwise).
    kept: tuple[int, ...] = ()
    replaced: tuple[int, ...] = ()

    def to_record(self) -> dict[str, Any]:
        record: dict[str, Any] = {"type": self.type, "attempt": self.attempt, "t": self.t,
                                  "resume": self.resume}
        if self.kept:
            record["kept"] = list(self.kept)
            record["replaced"] = list(self.replaced)
        return record

    @classmethod
    def _from_record(cls, record: Mapping[str, Any]) -> Event:
        return cls(t=record.get("t"), attempt=record.get("attempt"), resume=record.get("resume"),
                   kept=_ranks(record.get("kept")), replaced=_ranks(record.get("replaced")))


def _ranks(value: Any) -> tuple[int, ...]:
    return tuple(v for v in value if isinstance(v, int)) if isinstance(value, list) else ()


@dataclass(frozen=True, kw_only=True)
class _AttemptEvent(Event):
    attempt: int | None = None

    def to_record(self) -> dict[str, Any]:
        return {"type": self.type, "attempt": self.attempt, "t": self.t}

    @classmethod
    def _from_record(cls, record: Mapping[str, Any]) -> Event:
        return cls(t=record.get("t"), attempt=record.get("attempt"))


@dataclass(frozen=True, kw_only=True)
class WorkersReady(_AttemptEvent):
    """Every worker of the attempt connected."""

    TYPE: ClassVar[str] = "workers_ready"


@dataclass(frozen=True, kw_only=True)
class TrainStart(_AttemptEvent):
    """The train function started on the first rank."""

    TYPE: ClassVar[str] = "train_start"


@dataclass(frozen=True, kw_only=True)
class TrainEnd(_AttemptEvent):
    """The train function returned on every rank of the attempt."""

    TYPE: ClassVar[str] = "train_end"


@dataclass(frozen=True, kw_only=True)
class FirstReport(_AttemptEvent):
    """The first report of the attempt arrived."""

    TYPE: ClassVar[str] = "first_report"


@dataclass(frozen=True, kw_only=True)
class Blocked(Event):
    """A rank was blocked ``seconds`` in ``report()`` (``kind`` says where), up to ``t``."""

    TYPE: ClassVar[str] = "blocked"
    rank: int | None = None
    kind: str | None = None
    seconds: float | None = None
    index: int | None = None

    def to_record(self) -> dict[str, Any]:
        return {"type": self.type, "rank": self.rank, "kind": self.kind,
                "seconds": self.seconds, "t": self.t, "index": self.index}

    @classmethod
    def _from_record(cls, record: Mapping[str, Any]) -> Event:
        return cls(t=record.get("t"), rank=record.get("rank"), kind=record.get("kind"),
                   seconds=record.get("seconds"), index=record.get("index"))


@dataclass(frozen=True, kw_only=True)
class RestorePlanned(Event):
    """``FailureConfig(keep_survivors=True)``: the driver chose where ``rank`` restores the
    checkpoint of report ``index`` from in ``attempt``: ``kind`` is "memory" (its own
    copy), "peer" (``peer``'s copy), "driver" (its small files) or "storage"."""

    TYPE: ClassVar[str] = "restore_planned"
    attempt: int | None = None
    rank: int | None = None
    kind: str | None = None
    index: int | None = None
    peer: int | None = None
    reason: str | None = None

    def to_record(self) -> dict[str, Any]:
        return {"type": self.type, "t": self.t, "attempt": self.attempt, "rank": self.rank,
                "kind": self.kind, "index": self.index, "peer": self.peer,
                "reason": self.reason or ""}

    @classmethod
    def _from_record(cls, record: Mapping[str, Any]) -> Event:
        return cls(t=record.get("t"), attempt=record.get("attempt"), rank=record.get("rank"),
                   kind=record.get("kind"), index=record.get("index"),
                   peer=_count(record.get("peer")), reason=record.get("reason"))


@dataclass(frozen=True, kw_only=True)
class Restored(Event):
    """A rank restored the checkpoint of report ``index`` (with ``keep_survivors``):
    ``kind`` names its sources ("memory", "peer", "driver", "local tier", "storage", joined
    by "+"), the bytes from each (``peer``: who gave most), ``seconds`` it took, ``reason``:
    why storage was read ("" if not), ``prefetched``: peers asked from the attempt's start."""

    TYPE: ClassVar[str] = "restored"
    rank: int | None = None
    kind: str | None = None
    index: int | None = None
    peer: int | None = None
    memory_bytes: int | None = None
    peer_bytes: int | None = None
    driver_bytes: int | None = None  # the driver's copies of the rank's small files
    bytes: int | None = None  # read from storage
    seconds: float | None = None
    reason: str | None = None
    # Recorded only when true; ``seconds`` then counts from the start of the transfer.
    prefetched: bool = False

    def to_record(self) -> dict[str, Any]:
        record = {"type": self.type, "t": self.t, "rank": self.rank, "kind": self.kind,
                  "index": self.index, "peer": self.peer, "memory_bytes": self.memory_bytes,
                  "peer_bytes": self.peer_bytes, "bytes": self.bytes,
                  "seconds": self.seconds, "reason": self.reason or ""}
        extras = {"driver_bytes": self.driver_bytes, "prefetched": self.prefetched}
        record.update((key, value) for key, value in extras.items() if value)
        return record

    @classmethod
    def _from_record(cls, record: Mapping[str, Any]) -> Event:
        return cls(t=record.get("t"), rank=record.get("rank"), kind=record.get("kind"),
                   index=record.get("index"), peer=_count(record.get("peer")),
                   memory_bytes=_count(record.get("memory_bytes")),
                   peer_bytes=_count(record.get("peer_bytes")),
                   driver_bytes=_count(record.get("driver_bytes")), bytes=record.get("bytes"),
                   seconds=record.get("seconds"), reason=record.get("reason"),
                   prefetched=record.get("prefetched") is True)


@dataclass(frozen=True, kw_only=True)
class CheckpointStarted(Event):
    """A checkpoint directory is about to be written (before any upload starts)."""

    TYPE: ClassVar[str] = "checkpoint_started"
    dir_name: str | None = None
    index: int | None = None

    def to_record(self) -> dict[str, Any]:
        return {"type": self.type, "dir_name": self.dir_name, "index": self.index,
                "t": self.t}

    @classmethod
    def _from_record(cls, record: Mapping[str, Any]) -> Event:
        return cls(t=record.get("t"), dir_name=record.get("dir_name"), index=record.get("index"))


@dataclass(frozen=True, kw_only=True)
class Commit(Event):
    """The checkpoint of report ``index`` was committed in ``seconds``, ``bytes`` uploaded."""

    TYPE: ClassVar[str] = "commit"
    index: int | None = None
    seconds: float | None = None
    bytes: int | None = None

    def to_record(self) -> dict[str, Any]:
        return {"type": self.type, "index": self.index, "t": self.t, "seconds": self.seconds,
                "bytes": self.bytes}

    @classmethod
    def _from_record(cls, record: Mapping[str, Any]) -> Event:
        return cls(t=record.get("t"), index=record.get("index"), seconds=record.get("seconds"),
                   bytes=record.get("bytes"))


@dataclass(frozen=True, kw_only=True)
class Failure(Event):
    """An attempt failed: the ranks (the cause first), the one-line reason, each rank's
    error, the last commit before it, and whether it counts against ``max_failures``
    (not when a rank found the resume checkpoint damaged; older logs counted them all).
    ``attempt_t`` is what logs written before ``last_commit_t`` kept instead."""

    TYPE: ClassVar[str] = "failure"
    attempt: int | None = None
    ranks: tuple[int, ...] = ()
    reason: str | None = None
    last_commit_t: float | None = None
    errors: tuple[ErrorInfo, ...] = ()
    counted: bool = True
    attempt_t: float | None = None
    # A restart after a preemption notice: counted against max_preemption_failures instead.
    preemption: bool = False

    def to_record(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "type": self.type, "attempt": self.attempt, "t": self.t, "ranks": list(self.ranks),
            "reason": self.reason, "last_commit_t": self.last_commit_t,
            "errors": [{**e.as_dict(), "frame": None if e.frame is None else dict(e.frame)}
                       for e in self.errors],
            "counted": self.counted,
        }
        if self.attempt_t is not None:
            record["attempt_t"] = self.attempt_t
        if self.preemption:
            record["preemption"] = True
        return record

    @classmethod
    def _from_record(cls, record: Mapping[str, Any]) -> Event:
        return cls(t=record.get("t"), attempt=record.get("attempt"),
                   ranks=tuple(record.get("ranks", ())), reason=record.get("reason"),
                   last_commit_t=record.get("last_commit_t"),
                   errors=_errors(record.get("errors", ())),
                   counted=record.get("counted") is not False,
                   attempt_t=record.get("attempt_t"),
                   preemption=record.get("preemption") is True)


@dataclass(frozen=True, kw_only=True)
class PreemptionNotice(Event):
    """A node of the attempt is about to be reclaimed: its ``ranks``, the ``nodes``, the
    reclaim ``deadline_t`` (None: the notice had none) and how it was noticed (``source``:
    ``"SIGTERM"``, ``"drain"``)."""

    TYPE: ClassVar[str] = "preemption_notice"
    attempt: int | None = None
    ranks: tuple[int, ...] = ()
    nodes: tuple[str, ...] = ()
    deadline_t: float | None = None
    source: str | None = None

    def to_record(self) -> dict[str, Any]:
        return {"type": self.type, "t": self.t, "attempt": self.attempt,
                "ranks": list(self.ranks), "nodes": list(self.nodes),
                "deadline_t": self.deadline_t, "source": self.source}

    @classmethod
    def _from_record(cls, record: Mapping[str, Any]) -> Event:
        nodes = record.get("nodes")
        deadline = record.get("deadline_t")
        source = record.get("source")
        return cls(t=record.get("t"), attempt=record.get("attempt"),
                   ranks=tuple(record.get("ranks", ())),
                   nodes=tuple(n for n in nodes if isinstance(n, str))
                   if isinstance(nodes, (list, tuple)) else (),
                   deadline_t=(float(deadline) if deadline is not None and
                               schema.check_value(deadline, schema.TIME) is None else None),
                   source=source if isinstance(source, str) else None)


@dataclass(frozen=True, kw_only=True)
class DeletionsFailed(Event):
    """Checkpoint directories the run no longer needs that the storage refused to delete."""

    TYPE: ClassVar[str] = "deletions_failed"
    dir_names: tuple[str, ...] = ()

    def to_record(self) -> dict[str, Any]:
        return {"type": self.type, "dir_names": list(self.dir_names), "t": self.t}

    @classmethod
    def _from_record(cls, record: Mapping[str, Any]) -> Event:
        names = record.get("dir_names")
        return cls(t=record.get("t"), dir_names=tuple(n for n in names if isinstance(n, str))
                   if isinstance(names, (list, tuple)) else ())


@dataclass(frozen=True, kw_only=True)
class ValidationRequested(Event):
    """A validation of checkpoint ``dir_name`` was requested (before it committed)."""

    TYPE: ClassVar[str] = "validation_requested"
    dir_name: str | None = None
    index: int | None = None
    task: dict[str, Any] | None = None

    def to_record(self) -> dict[str, Any]:
        return {"type": self.type, "t": self.t, "dir_name": self.dir_name,
                "index": self.index, "task": self.task}

    @classmethod
    def _from_record(cls, record: Mapping[str, Any]) -> Event:
        return cls(t=record.get("t"), dir_name=record.get("dir_name"), index=record.get("index"),
                   task=_object(record.get("task")))


@dataclass(frozen=True, kw_only=True)
class ValidationFinished(Event):
    """A validation finished: ``status`` is a ``ReportedCheckpointStatus`` name."""

    TYPE: ClassVar[str] = "validation_finished"
    dir_name: str | None = None
    index: int | None = None
    status: str | None = None
    metrics: dict[str, Any] | None = None

    def to_record(self) -> dict[str, Any]:
        return {"type": self.type, "t": self.t, "dir_name": self.dir_name,
                "index": self.index, "status": self.status, "metrics": self.metrics}

    @classmethod
    def _from_record(cls, record: Mapping[str, Any]) -> Event:
        return cls(t=record.get("t"), dir_name=record.get("dir_name"), index=record.get("index"),
                   status=_text(record.get("status")), metrics=_object(record.get("metrics")))


@dataclass(frozen=True, kw_only=True)
class _CheckpointRemoved(Event):
    """A checkpoint ``dir_name`` that left the index, and why (``reason``)."""

    dir_name: str | None = None
    report_index: int | None = None
    reason: str = ""

    def to_record(self) -> dict[str, Any]:
        return {"type": self.type, "dir_name": self.dir_name,
                "report_index": self.report_index, "reason": self.reason, "t": self.t}

    @classmethod
    def _from_record(cls, record: Mapping[str, Any]) -> Event:
        return cls(t=record.get("t"), dir_name=record.get("dir_name"),
                   report_index=_count(record.get("report_index")),
                   reason=record.get("reason", ""))


@dataclass(frozen=True, kw_only=True)
class CheckpointDropped(_CheckpointRemoved):
    """A resume found checkpoint ``dir_name`` damaged and dropped it from the index."""

    TYPE: ClassVar[str] = "checkpoint_dropped"


@dataclass(frozen=True, kw_only=True)
class ReferenceRegistered(Event):
    """A checkpoint committed by reference: ``dir_name`` names ``target_uri`` or
    ``target_path``, so that a later deletion may trust it."""

    TYPE: ClassVar[str] = "reference_registered"
    dir_name: str | None = None
    report_index: int | None = None
    target_uri: str | None = None
    target_path: str | None = None

    def to_record(self) -> dict[str, Any]:
        return {"type": self.type, "dir_name": self.dir_name,
                "report_index": self.report_index, "target_uri": self.target_uri,
                "target_path": self.target_path, "t": self.t}

    @classmethod
    def _from_record(cls, record: Mapping[str, Any]) -> Event:
        return cls(t=record.get("t"), dir_name=record.get("dir_name"),
                   report_index=_count(record.get("report_index")),
                   target_uri=_text(record.get("target_uri")),
                   target_path=_text(record.get("target_path")))


@dataclass(frozen=True, kw_only=True)
class UnknownEvent(Event):
    """A record of a type this Cairn does not know (a newer writer): kept whole."""

    unknown_type: str
    record: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @property
    def type(self) -> str:
        return self.unknown_type

    def to_record(self) -> dict[str, Any]:
        return dict(self.record)


@dataclass(frozen=True, kw_only=True)
class CheckpointDeleting(_CheckpointRemoved):
    """Retention dropped checkpoint ``dir_name`` from the index; its deletion follows.

    Written (and flushed) before the deletion starts, so that a later driver that finds the
    directory half deleted, without its manifest, knows it was deleted on purpose and not
    lost to a store that answers "not found" (:mod:`cairn._src.checkpoint.recheck`).
    Not a :class:`CheckpointDropped`: readers of damage drops never see these.
    """

    TYPE: ClassVar[str] = "checkpoint_deleting"


EVENT_TYPES: dict[str, type[Event]] = {kind.TYPE: kind for kind in (
    SessionStart, SessionEnd, AttemptStart, WorkersReady, TrainStart, FirstReport, Blocked,
    CheckpointStarted, Commit, Failure, DeletionsFailed, ValidationRequested,
    ValidationFinished, CheckpointDropped, ReferenceRegistered, CheckpointDeleting,
    PreemptionNotice, RestorePlanned, Restored, TrainEnd)}


def parse_event(record: object, *, where: str) -> Event:
    """The typed event of ``record``, read back from the event log at ``where``.

    Raises :class:`ManifestError` naming ``where``, the field and what it should be when
    ``record`` does not match the event log's schema (the messages :func:`read_log` skips
    a record with).
    """
    checked: dict[str, Any] = schema.validate(record, EVENT_RECORD, where=where)
    return event_from_checked(checked)


def event_from_checked(record: Mapping[str, Any]) -> Event:
    """The typed event of a record that already passed the event log's schema."""
    kind = EVENT_TYPES.get(record["type"])
    if kind is None:
        return UnknownEvent(t=record.get("t"), unknown_type=record["type"], record=dict(record))
    return kind._from_record(record)


def as_events(items: Iterable[object]) -> list[Event]:
    """``items`` as typed events: events pass through; a record (a mapping built in memory,
    or read back) becomes its type, leniently as the readers always took it: a record
    without a ``type`` string is skipped, a field of the wrong type is taken as absent
    (``t`` included: it is None then), and from a list of ranks the entries that are not
    ranks are dropped."""
    events: list[Event] = []
    for item in items:
        if isinstance(item, Event):
            events.append(item)
        elif isinstance(item, Mapping) and isinstance(item.get("type"), str) and item["type"]:
            events.append(event_from_checked(_lenient_fields(item)))
    return events


_FIELDS: Mapping[str, schema.Schema] = (
    EVENT_RECORD.schema.fields if isinstance(EVENT_RECORD.schema, schema.Object) else {})


def _lenient_fields(record: Mapping[str, Any]) -> dict[str, Any]:
    cleaned: dict[str, Any] = {}
    for name, value in record.items():
        check = _FIELDS.get(name)
        if check is None or schema.check_value(value, check) is None:
            cleaned[name] = value
        elif isinstance(check, schema.ListOf) and isinstance(value, (list, tuple)):
            cleaned[name] = [v for v in value if schema.check_value(v, check.item) is None]
    return cleaned


def read_events(directory: StorageLocation, retry: RetryPolicy) -> list[Event]:
    """Every valid event of the log in ``directory``, in order (see :func:`read_log`:
    invalid records are skipped with one warning, an outage is raised)."""
    return [event_from_checked(r) for r in read_log(directory, retry, document=EVENT_RECORD)]
