"""Where each rank's wall time went, as intervals on a timeline: the data of
``cairn goodput -o``.

Pure logic over the run's typed events (:mod:`cairn._src.run.events`; the types
:mod:`cairn._src.goodput.summary` lists). The log is untrusted input: a record that does
not match its schema (no finite ``t``, a value of the wrong type) is skipped.
The categories are those of the goodput summary:

* ``startup``: an attempt's worker group starting, up to the train function's start
  (``attempt_start`` to ``train_start``, or to ``first_report`` in older logs);
* ``recovery``: the same after a failure, measured from the failure, as the summary does;
* ``training``: the rest of an attempt's time;
* ``checkpoint_stall``: a rank blocked in ``report()`` (a ``blocked`` event: it ends at
  ``t`` and lasted ``seconds``);
* ``validation_wait``: the driver waiting for validations after the train function
  returned on every rank (``train_end`` to the last ``validation_finished`` after it;
  nothing in logs written before ``train_end``);
* ``lost_work``: the work of a failed attempt after its last commit, which the next
  attempt redoes (``last_commit_t``, or the train start if later, to the failure).

Each (attempt, rank) lane is a sequence of disjoint, ordered intervals; where categories
overlap, the later one in ``_PRIORITY`` wins (a failed attempt's stalls after its last
commit are lost work).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from cairn._src.run.events import (
    AttemptStart,
    Blocked,
    Commit,
    ErrorInfo,
    Event,
    Failure,
    FirstReport,
    Restored,
    SessionEnd,
    SessionStart,
    TrainEnd,
    TrainStart,
    ValidationFinished,
    as_events,
)

CATEGORIES = ("training", "checkpoint_stall", "validation_wait", "lost_work", "startup",
              "recovery")
_PRIORITY = {category: rank for rank, category in enumerate(CATEGORIES)}
_DETAIL_CHARS = 120
_MAX_RANKS = 4096  # lanes of one attempt
# Lanes in all: a chart draws a few dozen; a crash-looping (or forged) log of thousands of
# attempts times thousands of ranks would otherwise take minutes and gigabytes.
_MAX_LANES = 4096
# Events at the same instant, in the order they can happen (a sort is stable otherwise).
_TIE_ORDER = {"session_start": 0, "failure": 1, "attempt_start": 2, "workers_ready": 3,
              "train_start": 4, "first_report": 4, "session_end": 9}


@dataclass(frozen=True)
class Interval:
    """``[start, end)`` in seconds since the run's start, spent on ``category``."""

    start: float
    end: float
    category: str

    def as_dict(self) -> dict[str, Any]:
        return {"start": self.start, "end": self.end, "category": self.category}


@dataclass(frozen=True)
class Lane:
    """One rank's time in one attempt; ``rank`` is None when the log names no rank (a run
    whose reports never blocked)."""

    attempt: int
    rank: int | None
    intervals: tuple[Interval, ...]
    # keep_survivors: where the rank restored from ("memory", "peer rank 0", "local tier",
    # "storage").
    restored_from: str | None = None

    @property
    def label(self) -> str:
        return (f"attempt {self.attempt}" + ("" if self.rank is None else f" · rank {self.rank}")
                + ("" if self.restored_from is None else f" · from {self.restored_from}"))

    def seconds(self, category: str) -> float:
        return sum(i.end - i.start for i in self.intervals if i.category == category)

    def as_dict(self) -> dict[str, Any]:
        record: dict[str, Any] = {"attempt": self.attempt, "rank": self.rank,
                                  "intervals": [i.as_dict() for i in self.intervals]}
        if self.restored_from is not None:
            record["restored_from"] = self.restored_from
        return record


@dataclass(frozen=True)
class FailureMark:
    """An attempt that failed, at ``t`` seconds since the run's start."""

    attempt: int
    t: float
    label: str
    detail: str
    errors: tuple[ErrorInfo, ...] = ()
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "t": self.t, "label": self.label,
                "reason": self.reason, "errors": [e.as_dict() for e in self.errors]}


@dataclass(frozen=True)
class Timeline:
    """The lanes in order (by attempt, then rank), the failures, and the times of the
    commits, all in seconds since ``started_at`` (a Unix time; None for an empty log).
    ``lanes`` are the first of :attr:`lane_count`; ``lanes_left_out`` were not built."""

    started_at: float | None
    lanes: tuple[Lane, ...] = ()
    failures: tuple[FailureMark, ...] = ()
    commits: tuple[float, ...] = ()
    end: float = 0.0
    lanes_left_out: int = 0

    @property
    def lane_count(self) -> int:
        """The lanes of the run (one per attempt and rank), built or not."""
        return len(self.lanes) + self.lanes_left_out

    def as_dict(self) -> dict[str, Any]:
        return {"started_at": self.started_at, "end": self.end, "lane_count": self.lane_count,
                "lanes": [lane.as_dict() for lane in self.lanes],
                "failures": [f.as_dict() for f in self.failures],
                "commits": list(self.commits)}


def cause_first(errors: Iterable[ErrorInfo], ranks: object) -> tuple[ErrorInfo, ...]:
    """``errors`` in the order of the failure event's ``ranks``, which name the rank that
    died first before the ranks that then failed in a collective (the controller writes
    them so); errors of ranks it does not name keep their place after those."""
    order: dict[int, int] = {}
    for position, rank in enumerate(ranks if isinstance(ranks, (list, tuple)) else ()):
        if isinstance(rank, int) and not isinstance(rank, bool):
            order.setdefault(rank, position)
    listed = list(errors)
    return tuple(sorted(listed, key=lambda e: min(
        (order[r] for r in e.ranks if r in order), default=len(order))))


def describe_failure(errors: Iterable[ErrorInfo], reason: str) -> tuple[str, str]:
    """A short label (``"rank 1: WorkerProcessError"``) and a one-line detail (with the
    first error's message) for a failure, from its per-rank errors or else its reason."""
    by_type: dict[str, list[int]] = {}
    messages: list[str] = []
    for error in errors:
        name = error.type.rpartition(".")[2] or "error"
        by_type.setdefault(name, []).extend(error.ranks)
        messages.append(error.message.splitlines()[0] if error.message else "")
    if not by_type:
        line = reason.splitlines()[0] if reason else "failed"
        return _shorten(line, 40), _shorten(line, _DETAIL_CHARS)
    parts = []
    for name, ranks in by_type.items():
        ranks = sorted(set(ranks))
        who = ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
        parts.append(f"{who}: {name}" if ranks else name)
    label = "; ".join(parts)
    detail = label + (f" ({messages[0]})" if messages and messages[0] else "")
    return _shorten(label, 48), _shorten(detail, _DETAIL_CHARS)


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass
class AttemptSpan:
    """One attempt's times (Unix times), as :func:`walk` finds them in the log."""

    number: int
    start: float
    recovering_from: float | None = None
    train_start: float | None = None
    end: float | None = None
    lost_from: float | None = None
    # When the train function had returned on every rank, and when the last validation
    # that finished after that did.
    train_end: float | None = None
    waited_until: float | None = None
    # (rank, start, end) of each time a rank was blocked in report().
    stalls: list[tuple[int, float, float]] = field(default_factory=list)
    restored: dict[int, str] = field(default_factory=dict)

    def phases(self) -> tuple[float, float, float, float]:
        """``(begin, trained, lost, end)``, in order: start-up (or recovery, from the
        failure before) is ``[begin, trained)``, training ``[trained, end)``, of which
        ``[lost, end)`` is lost work (``lost == end`` when the attempt did not fail).
        Lost work never starts before training: start-up and recovery are counted once."""
        end = self.end if self.end is not None else self.start
        begin = self.start if self.recovering_from is None else min(self.start,
                                                                    self.recovering_from)
        end = max(end, begin)
        trained = self.train_start if self.train_start is not None else end
        trained = min(max(trained, begin), end)
        lost = end if self.lost_from is None else min(max(self.lost_from, trained), end)
        return begin, trained, lost, end

    def validation_wait(self) -> tuple[float, float]:
        """``(start, stop)``: the driver waited for validations once the train function had
        returned on every rank, up to the last one that finished; inside the training of
        :meth:`phases`, before its lost work (``start == stop``: it did not wait)."""
        _, trained, lost, _ = self.phases()
        if self.train_end is None or self.waited_until is None:
            return lost, lost
        start = min(max(self.train_end, trained), lost)
        return start, min(max(self.waited_until, start), lost)


@dataclass
class Walk:
    """What one pass over a run's ordered events finds: the attempts, the failures (each
    with the number of its attempt, -1 when unknown), the commits' times, every rank the
    log names, and the time of the last event."""

    spans: list[AttemptSpan] = field(default_factory=list)
    failures: list[tuple[int, float, Failure]] = field(default_factory=list)
    commits: list[float] = field(default_factory=list)
    ranks: set[int] = field(default_factory=set)
    last_t: float = 0.0


def ordered_events(events: Iterable[object]) -> list[tuple[float, Event]]:
    """The typed ``events`` that have a time, as ``(t, event)`` sorted by time; events at
    the same instant in the order they can happen."""
    return sorted(((float(e.t), e) for e in as_events(events) if e.t is not None),
                  key=lambda pair: (pair[0], _TIE_ORDER.get(pair[1].type, 5)))


def walk(ordered: Iterable[tuple[float, Event]]) -> Walk:
    """The attempts of a run and their times, from its :func:`ordered_events`."""
    found = Walk()
    current: AttemptSpan | None = None
    failed_at: float | None = None
    for t, event in ordered:
        if isinstance(event, SessionStart):
            if current is not None:
                # The previous driver died without a word: its attempt ended with its
                # last event.
                current.end = found.last_t
                current = None
            failed_at = None
        elif isinstance(event, AttemptStart):
            if current is not None:
                current.end = t
            number = event.attempt
            if number is None:
                number = found.spans[-1].number + 1 if found.spans else 0
            current = AttemptSpan(number=number, start=t, recovering_from=failed_at)
            found.spans.append(current)
        elif isinstance(event, (TrainStart, FirstReport)):
            if current is not None and current.train_start is None:
                current.train_start = t
                failed_at = None
        elif isinstance(event, TrainEnd):
            if current is not None and current.train_end is None:
                current.train_end = t
        elif isinstance(event, ValidationFinished):
            if current is not None and current.train_end is not None:
                current.waited_until = t
        elif isinstance(event, Blocked):
            rank, seconds = event.rank, event.seconds
            if rank is not None and seconds is not None and current is not None:
                found.ranks.add(rank)
                current.stalls.append((rank, t - max(0.0, seconds), t))
        elif isinstance(event, Restored):
            if current is not None and event.rank is not None and event.kind:
                current.restored[event.rank] = _restore_source(event)
        elif isinstance(event, Commit):
            found.commits.append(t)
        elif isinstance(event, Failure):
            for error in event.errors:
                found.ranks.update(error.ranks)
            found.ranks.update(event.ranks)
            attempt = event.attempt
            if current is not None:
                since = event.last_commit_t or event.attempt_t
                current.lost_from = current.start if since is None else float(since)
                current.end = t
                attempt = current.number if attempt is None else attempt
                current = None
            found.failures.append((attempt if attempt is not None else -1, t, event))
            failed_at = t
        elif isinstance(event, SessionEnd):
            if current is not None:
                current.end = t
                current = None
        found.last_t = t
    if current is not None:
        current.end = found.last_t
    return found


def build_timeline(events: Iterable[object]) -> Timeline:
    """The :class:`Timeline` of a run's ``events`` (typed, or records as the log stores
    them; any order; sorted by ``t``). At most ``_MAX_LANES`` lanes are built, the first
    ones; :attr:`Timeline.lane_count` counts them all."""
    ordered = ordered_events(events)
    if not ordered:
        return Timeline(started_at=None)
    found = walk(ordered)
    ranks = found.ranks
    origin = ordered[0][0]
    # Ranks are 0..N-1: a rank the log never names (it never blocked) still had a lane.
    # (The log is untrusted: an absurd rank does not make millions of lanes, nor do many
    # attempts times many ranks.)
    lane_ranks: list[int | None] = (
        [None] if not ranks else list(range(max(ranks) + 1)) if max(ranks) < _MAX_RANKS
        else list(sorted(ranks)[:_MAX_RANKS]))
    lanes: list[Lane] = []
    for span in found.spans:
        if len(lanes) >= _MAX_LANES:
            break
        stalls: dict[int | None, list[tuple[float, float]]] = {}
        for stalled, start, end in span.stalls:
            stalls.setdefault(stalled, []).append((start, end))
        for rank in lane_ranks[:_MAX_LANES - len(lanes)]:
            lanes.append(Lane(span.number, rank,
                              _paint(_paints(span, stalls.get(rank, [])), origin),
                              span.restored.get(rank) if rank is not None else None))
    marks = []
    for attempt, t, event in found.failures:
        errors, reason = cause_first(event.errors, event.ranks), event.reason or ""
        label, detail = describe_failure(errors, reason)
        marks.append(FailureMark(attempt, t - origin, label, detail, errors, reason))
    return Timeline(started_at=origin, lanes=tuple(lanes), failures=tuple(marks),
                    commits=tuple(t - origin for t in found.commits),
                    end=found.last_t - origin,
                    lanes_left_out=len(found.spans) * len(lane_ranks) - len(lanes))


def _restore_source(event: Restored) -> str:
    """"memory", "peer rank 0", "local tier", "storage", or their mix ("peer rank
    0+storage")."""
    peer = f"peer rank {event.peer}" if event.peer is not None else "peer"
    return "+".join(peer if part == "peer" else part for part in str(event.kind).split("+"))


def stall_seconds(span: AttemptSpan) -> float:
    """The seconds of ``span`` during which at least one rank was blocked in ``report()``
    and that the timeline paints as a stall: all ranks' stalls painted in one lane, where
    start-up, recovery, lost work and the validation wait win over a stall."""
    stalls = [(start, stop) for _rank, start, stop in span.stalls]
    return sum(i.end - i.start for i in _paint(_paints(span, stalls), 0.0)
               if i.category == "checkpoint_stall")


def _paints(span: AttemptSpan,
            stalls: list[tuple[float, float]]) -> list[tuple[float, float, str]]:
    begin, trained, lost, end = span.phases()
    paints = [(begin, trained, "startup" if span.recovering_from is None else "recovery"),
              (trained, end, "training"), (*span.validation_wait(), "validation_wait"),
              (lost, end, "lost_work")]
    paints.extend((max(a, begin), min(b, end), "checkpoint_stall") for a, b in stalls)
    return [(a, b, c) for a, b, c in paints if b > a]


def _paint(paints: list[tuple[float, float, str]], origin: float) -> tuple[Interval, ...]:
    """Disjoint intervals from overlapping ``paints``: on each stretch the category of
    highest priority that covers it (a sweep over the boundaries, O(n log n))."""
    boundaries: list[tuple[float, int, str]] = []
    for start, end, category in paints:
        boundaries.append((start, 1, category))
        boundaries.append((end, -1, category))
    boundaries.sort(key=lambda b: b[0])
    active = [0] * len(CATEGORIES)
    out: list[Interval] = []
    position: float | None = None
    i = 0
    while i < len(boundaries):
        at = boundaries[i][0]
        if position is not None and at > position:
            top = max((p for p, n in enumerate(active) if n > 0), default=None)
            if top is not None:
                category = CATEGORIES[top]
                start, end = position - origin, at - origin
                if out and out[-1].category == category and out[-1].end == start:
                    out[-1] = Interval(out[-1].start, end, category)
                else:
                    out.append(Interval(start, end, category))
        while i < len(boundaries) and boundaries[i][0] == at:
            active[_PRIORITY[boundaries[i][2]]] += boundaries[i][1]
            i += 1
        position = at
    return tuple(out)
