"""What a run's event log says about how it went: its status, attempts and failures.

Pure logic over the typed events of the log (:mod:`cairn._src.run.events`; records given
as dicts are checked and parsed first, and those that do not match are skipped: the log is
untrusted input). Used by ``cairn ls``, ``cairn show``
and :meth:`Result.from_path`.

A run's status is that of its last driver session:

* ``running``: a live driver holds the run's lease (the caller says so);
* ``finished`` / ``failed``: the session ended and said so (``session_end``); a failed one
  carries its error;
* ``interrupted``: the session was stopped (Ctrl-C) or its driver died without a word (a
  ``kill -9``, a lost machine): its events stop with no ``session_end``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from cairn._src.run.events import (
    AttemptStart,
    ErrorInfo,
    Failure,
    SessionEnd,
    SessionStart,
    as_events,
)

__all__ = ["STATUSES", "ErrorInfo", "FailureInfo", "RunHistory", "run_history"]

STATUSES = ("running", "finished", "failed", "interrupted", "new")


@dataclass(frozen=True)
class FailureInfo:
    """An attempt that failed: when, which ranks, the one-line reason and each rank's
    error."""

    attempt: int | None
    t: float | None
    ranks: tuple[int, ...]
    reason: str
    errors: tuple[ErrorInfo, ...] = ()
    # Against max_failures: not a preemption, nor the restart after a rank found its resume
    # checkpoint damaged (contract item 10). A log that does not say counts it.
    counted: bool = True

    def as_dict(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "t": self.t, "ranks": list(self.ranks),
                "reason": self.reason, "errors": [e.as_dict() for e in self.errors]}


@dataclass(frozen=True)
class RunHistory:
    status: str
    sessions: int = 0
    attempts: int = 0
    failures: tuple[FailureInfo, ...] = ()
    error: ErrorInfo | None = None
    started_at: float | None = None
    last_event_at: float | None = None
    restarts_at: tuple[float, ...] = field(default=())


def run_history(events: Iterable[object], *, driver_live: bool = False) -> RunHistory:
    """Fold ``events`` (in log order) into the run's :class:`RunHistory`."""
    sessions = attempts = 0
    failures: list[FailureInfo] = []
    restarts: list[float] = []
    started_at = last_t = None
    session_open = False
    last_status: str | None = None
    last_error: ErrorInfo | None = None
    for event in as_events(events):
        t = None if event.t is None else float(event.t)
        if t is not None:
            last_t = t if last_t is None else max(last_t, t)
        if isinstance(event, SessionStart):
            sessions += 1
            session_open = True
            last_status, last_error = None, None
            if started_at is None:
                started_at = t
        elif isinstance(event, AttemptStart):
            attempts += 1
            if attempts > 1 and t is not None:
                restarts.append(t)
        elif isinstance(event, Failure):
            failures.append(FailureInfo(attempt=event.attempt, t=t, ranks=event.ranks,
                                        reason=event.reason or "", errors=event.errors,
                                        counted=event.counted))
        elif isinstance(event, SessionEnd):
            session_open = False
            status = event.status
            last_status = status if status in ("finished", "failed", "interrupted") else None
            last_error = event.error
            if last_status is None:
                # A log written before session_end said how the session went.
                last_status = "failed" if failures and _failed_last(failures, restarts) \
                    else "finished"
    if driver_live:
        status = "running"
    elif sessions == 0:
        status = "new"
    elif session_open:
        status = "interrupted"
    else:
        status = last_status or "interrupted"
    if status == "failed" and last_error is None and failures:
        last = failures[-1]
        last_error = last.errors[0] if last.errors else ErrorInfo("", last.ranks, last.reason)
    return RunHistory(status=status, sessions=sessions, attempts=attempts,
                      failures=tuple(failures), error=last_error if status == "failed" else None,
                      started_at=started_at, last_event_at=last_t, restarts_at=tuple(restarts))


def _failed_last(failures: list[FailureInfo], restarts: list[float]) -> bool:
    last_failure = failures[-1].t
    return last_failure is not None and (not restarts or restarts[-1] <= last_failure)
