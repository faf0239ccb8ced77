"""What ``cairn plot`` draws: a run's metric series, one per attempt, with its restarts and
checkpoints.

Pure logic over the run's metrics history, event log and index (untrusted input: records
with values of the wrong type are skipped). Each attempt is its own series: a restart
resumes from an earlier checkpoint, so the lines of two attempts are never joined.

The x axis is one of:

* ``report``: the report index (numbering continues across restarts);
* ``step``: the ``step`` metric the train function reports (redone steps overlap);
* ``time``: wall time in seconds since the run's first driver started.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cairn._src.errors import ConfigError
from cairn._src.goodput.timeline import cause_first, describe_failure
from cairn._src.run.events import (
    AttemptStart,
    CheckpointDeleting,
    CheckpointDropped,
    Commit,
    ErrorInfo,
    Event,
    Failure,
    SessionStart,
    as_events,
)
from cairn._src.run.report_checks import rankable
from cairn._src.storage.uris import redact_text

X_AXES = ("report", "step", "time")
STEP_METRIC = "step"
JSON_VERSION = 1
CHECKPOINT_STATUSES = ("kept", "deleted", "uncommitted")


@dataclass(frozen=True)
class Series:
    """One metric over one attempt: parallel tuples of report indexes, x and y values."""

    metric: str
    attempt: int
    report: tuple[int, ...]
    x: tuple[float, ...]
    y: tuple[float, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "attempt": self.attempt, "report": list(self.report),
                "x": list(self.x), "y": list(self.y)}


@dataclass(frozen=True)
class CheckpointMark:
    """A report that carried a checkpoint. ``status``: ``kept`` (in the run index now),
    ``deleted`` (committed, then dropped by retention or as damaged) or ``uncommitted``
    (its attempt failed before the commit: no record proves a commit, see
    :func:`_committed`)."""

    dir_name: str
    report: int
    attempt: int
    x: float | None
    status: str

    def as_dict(self) -> dict[str, Any]:
        return {"dir_name": self.dir_name, "report": self.report, "attempt": self.attempt,
                "x": self.x, "status": self.status}


@dataclass(frozen=True)
class RestartMark:
    """Attempt ``attempt`` failed at ``t`` (seconds since the run's start); the next
    attempt resumed from ``resumed_from`` (report ``resumed_from_report``; both None when
    it started from scratch, or when no attempt followed). ``x`` is where the restart is
    drawn: between the two attempts' reports, at the first step of the next attempt, or
    at the failure's time. ``counted`` is False for a failure that did not count against
    ``max_failures`` (a rank found the checkpoint it resumed from damaged). ``reason``,
    the ``errors``' messages and so ``label`` and ``detail`` have any URI credentials
    masked (:func:`masked_failure`)."""

    number: int
    attempt: int
    t: float | None
    x: float | None
    label: str
    detail: str
    reason: str
    errors: tuple[ErrorInfo, ...]
    restarted: bool
    resumed_from: str | None
    resumed_from_report: int | None
    counted: bool = True

    def as_dict(self) -> dict[str, Any]:
        return {"number": self.number, "attempt": self.attempt, "t": self.t, "x": self.x,
                "label": self.label, "reason": self.reason,
                "errors": [e.as_dict() for e in self.errors], "restarted": self.restarted,
                "resumed_from": self.resumed_from,
                "resumed_from_report": self.resumed_from_report, "counted": self.counted}


@dataclass(frozen=True)
class MetricPlot:
    run: str
    x_axis: str
    log: bool
    metrics: tuple[str, ...]
    series: tuple[Series, ...]
    checkpoints: tuple[CheckpointMark, ...]
    restarts: tuple[RestartMark, ...]
    started_at: float | None

    def series_of(self, metric: str) -> list[Series]:
        return [s for s in self.series if s.metric == metric]

    def lost_from(self, attempt: int) -> int | None:
        """The report index after which ``attempt``'s reports were redone by the next
        attempt (None when nothing of it was redone)."""
        for restart in self.restarts:
            if restart.attempt == attempt and restart.restarted:
                return 0 if restart.resumed_from is None else restart.resumed_from_report
        return None

    def as_dict(self) -> dict[str, Any]:
        return {"version": JSON_VERSION, "run": self.run, "x": self.x_axis, "log": self.log,
                "started_at": self.started_at, "metrics": list(self.metrics),
                "series": [s.as_dict() for s in self.series],
                "checkpoints": [c.as_dict() for c in self.checkpoints],
                "restarts": [r.as_dict() for r in self.restarts]}


def _number(value: object) -> float | None:
    number = rankable(value)
    return number if number is not None and math.isfinite(number) else None


def _since(t: float | None, started_at: float | None) -> float | None:
    """Seconds from ``started_at`` to ``t``; None when either is unknown, or when the
    difference overflows (a forged log's ``-1.5e308`` and ``1.5e308``)."""
    if t is None or started_at is None:
        return None
    return _number(t - started_at)


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
        else None


def numeric_metrics(records: Iterable[Mapping[str, Any]]) -> list[str]:
    """The names of the metrics with a finite number in at least one record, sorted."""
    names: set[str] = set()
    for record in records:
        metrics = record.get("metrics")
        if isinstance(metrics, Mapping):
            names.update(k for k, v in metrics.items()
                         if isinstance(k, str) and _number(v) is not None)
    return sorted(names)


def check_request(records: Sequence[Mapping[str, Any]], metrics: Sequence[str],
                  x_axis: str) -> None:
    """Refuse metrics the run has no numeric value of, and ``--x step`` for a run that
    reports no ``step``; the error names the metrics the run has."""
    if x_axis not in X_AXES:
        raise ConfigError(f"--x={x_axis!r} is not one of {', '.join(map(repr, X_AXES))}")
    have = numeric_metrics(records)
    for metric in metrics:
        if metric not in have:
            raise ConfigError(f"--metric={metric!r} is not a numeric metric of this run; "
                              f"metrics: {have}")
    if x_axis == "step" and STEP_METRIC not in have:
        raise ConfigError(f"--x step needs a numeric {STEP_METRIC!r} metric in the run's "
                          f"reports; metrics: {have}. Use --x report or --x time.")


@dataclass(frozen=True)
class _Record:
    report: int
    attempt: int
    time: float | None
    metrics: Mapping[str, Any]
    dir_name: str | None


def _records(raw: Iterable[Mapping[str, Any]], attempt_starts: list[tuple[float, int]]
             ) -> list[_Record]:
    out: dict[int, _Record] = {}
    for record in raw:
        report, metrics = _count(record.get("report_index")), record.get("metrics")
        if report is None or not isinstance(metrics, Mapping):
            continue
        t = _number(record.get("time"))
        attempt = _count(record.get("attempt"))
        if attempt is None:
            # Logs that did not say: the attempt that had started by then.
            attempt = max((a for s, a in attempt_starts if t is not None and s <= t), default=0)
        name = record.get("checkpoint_dir_name")
        # A report index appears once per run; a duplicate (a rewritten segment) keeps the
        # last record.
        out[report] = _Record(report, attempt, t, metrics, name if isinstance(name, str)
                              else None)
    return sorted(out.values(), key=lambda r: r.report)


def build_plot(
    run: str,
    records: Sequence[Mapping[str, Any]],
    events: Iterable[object],
    kept: Mapping[str, int],
    metrics: Sequence[str],
    x_axis: str = "report",
    *,
    log: bool = False,
    resumed_from: str | None = None,
) -> MetricPlot:
    """The :class:`MetricPlot` of ``metrics`` from a run's metrics ``records``, its
    ``events`` and ``kept``, the run index's checkpoints (directory name to report index);
    ``resumed_from`` is the run index's (the checkpoint the last attempt resumed from).

    Raises :class:`ConfigError` for a metric the run lacks (see :func:`check_request`).
    """
    check_request(records, metrics, x_axis)
    ordered = sorted(((float(e.t), e) for e in as_events(events) if e.t is not None),
                     key=lambda p: p[0])
    started_at = next((t for t, e in ordered if isinstance(e, SessionStart)),
                      ordered[0][0] if ordered else None)
    attempt_starts = [(t, e.attempt) for t, e in ordered
                      if isinstance(e, AttemptStart) and e.attempt is not None]
    rows = _records(records, attempt_starts)
    if started_at is None:
        started_at = min((r.time for r in rows if r.time is not None), default=None)

    def x_of(row: _Record) -> float | None:
        if x_axis == "report":
            return float(row.report)
        if x_axis == "step":
            return _number(row.metrics.get(STEP_METRIC))
        return _since(row.time, started_at)

    series: list[Series] = []
    for metric in metrics:
        by_attempt: dict[int, list[tuple[int, float, float]]] = {}
        for row in rows:
            x, y = x_of(row), _number(row.metrics.get(metric))
            if x is not None and y is not None:
                by_attempt.setdefault(row.attempt, []).append((row.report, x, y))
        for attempt in sorted(by_attempt):
            points = by_attempt[attempt]
            series.append(Series(metric, attempt, tuple(p[0] for p in points),
                                 tuple(p[1] for p in points), tuple(p[2] for p in points)))
        lowest = min((y for s in series if s.metric == metric for y in s.y), default=1.0)
        if log and lowest <= 0:
            raise ConfigError(f"--log needs values > 0, and --metric={metric!r} has "
                              f"{lowest:.4g}; drop --log for this metric")
    committed_reports, committed_names = _committed([e for _, e in ordered], resumed_from)
    checkpoints = []
    for row in rows:
        if row.dir_name is None:
            continue
        committed = row.report in committed_reports or row.dir_name in committed_names
        status = ("kept" if row.dir_name in kept
                  else "deleted" if committed else "uncommitted")
        checkpoints.append(CheckpointMark(row.dir_name, row.report, row.attempt, x_of(row),
                                          status))
    report_of = {**{r.dir_name: r.report for r in rows if r.dir_name is not None}, **kept}
    restarts = _restarts(ordered, rows, x_of, started_at, x_axis, report_of)
    return MetricPlot(run=run, x_axis=x_axis, log=log, metrics=tuple(metrics),
                      series=tuple(series), checkpoints=tuple(checkpoints),
                      restarts=tuple(restarts), started_at=started_at)


def _committed(events: Iterable[Event], resumed_from: str | None
               ) -> tuple[set[int], set[str]]:
    """The report indexes and directory names of the checkpoints that records prove were
    committed: a ``commit``; an attempt (or the run index) that resumed from it; retention
    deleting it (``checkpoint_deleting``) or a resume dropping it as damaged
    (``checkpoint_dropped``), both of which only ever drop what the index held.

    Not the ``commit`` events alone: a driver killed with ``kill -9`` loses the events it
    had not flushed yet (about a second's), its last commits among them, while the index
    it wrote, and so what the next driver resumed from and retention deleted, still
    names those checkpoints."""
    reports: set[int] = set()
    names: set[str] = {resumed_from} if isinstance(resumed_from, str) else set()
    for event in events:
        if isinstance(event, Commit) and (index := _count(event.index)) is not None:
            reports.add(index)
        elif isinstance(event, AttemptStart) and isinstance(event.resume, str):
            names.add(event.resume)
        elif isinstance(event, (CheckpointDeleting, CheckpointDropped)):
            if isinstance(event.dir_name, str):
                names.add(event.dir_name)
            if event.report_index is not None:
                reports.add(event.report_index)
    return reports, names


def masked_failure(errors: Iterable[ErrorInfo], reason: str
                   ) -> tuple[tuple[ErrorInfo, ...], str]:
    """A failure's ``errors`` and ``reason`` with every URI's credentials in them masked
    (:func:`redact_text`), as ``cairn show`` prints them: the event log is untrusted (written
    before the driver masked them, or forged). Masked before any shortening, which could
    cut a URI's ``@`` off and leave its password unrecognised."""
    return (tuple(dataclasses.replace(e, message=redact_text(e.message)) for e in errors),
            redact_text(reason))


def _restarts(ordered: list[tuple[float, Event]], rows: list[_Record],
              x_of: Any, started_at: float | None, x_axis: str,
              report_of: Mapping[str, int]) -> list[RestartMark]:
    marks: list[RestartMark] = []
    for position, (t, event) in enumerate(ordered):
        if not isinstance(event, Failure) or event.attempt is None:
            continue
        attempt = event.attempt
        following = next((e for _, e in ordered[position + 1:]
                          if isinstance(e, AttemptStart)), None)
        resume = following.resume if following is not None else None
        next_attempt = following.attempt if following is not None else None
        failed_xs = [x for r in rows if r.attempt == attempt and (x := x_of(r)) is not None]
        next_xs = [x for r in rows if r.attempt == next_attempt
                   and (x := x_of(r)) is not None] if next_attempt is not None else []
        if x_axis == "time":
            x = _since(t, started_at)
        elif next_xs:
            x = next_xs[0] - (0.5 if x_axis == "report" else 0.0)
        elif failed_xs:
            x = failed_xs[-1] + (0.5 if x_axis == "report" else 0.0)
        else:
            x = None
        errors, reason = masked_failure(cause_first(event.errors, event.ranks),
                                        event.reason or "")
        label, detail = describe_failure(errors, reason)
        marks.append(RestartMark(
            number=len(marks) + 1, attempt=attempt,
            t=_since(t, started_at), x=x, label=label,
            detail=detail, reason=reason, errors=errors, restarted=following is not None,
            resumed_from=resume,
            resumed_from_report=report_of.get(resume) if resume is not None else None,
            # Written since failures could be left uncounted; older logs counted them all.
            counted=event.counted,
        ))
    return marks
