"""What a run's event log says about how it went: its status, attempts and failures.

Pure logic over the events :mod:`cairn._src.controller.controller` writes (untrusted input:
a value of the wrong type is skipped, never trusted). Used by ``cairn ls``, ``cairn show``
and :meth:`Result.from_path`.

A run's status is that of its last driver session:

* ``running``: a live driver holds the run's lease (the caller says so);
* ``finished`` / ``failed``: the session ended and said so (``session_end``); a failed one
  carries its error;
* ``interrupted``: the session was stopped (Ctrl-C) or its driver died without a word (a
  ``kill -9``, a lost machine): its events stop with no ``session_end``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

STATUSES = ("running", "finished", "failed", "interrupted", "new")


@dataclass(frozen=True)
class ErrorInfo:
    """One error as the event log keeps it: its type's name, the ranks and the message."""

    type: str
    ranks: tuple[int, ...]
    message: str

    @staticmethod
    def parse(value: object) -> ErrorInfo | None:
        if not isinstance(value, Mapping):
            return None
        kind, message, ranks = value.get("type"), value.get("message"), value.get("ranks", ())
        if not isinstance(kind, str) or not isinstance(message, str):
            return None
        if not isinstance(ranks, (list, tuple)):
            ranks = ()
        return ErrorInfo(kind, tuple(r for r in ranks if _is_int(r)), message)

    @property
    def rank(self) -> int | None:
        """The first failed rank, or None when the error is not a rank's (the driver's)."""
        return self.ranks[0] if self.ranks else None

    def as_dict(self) -> dict[str, Any]:
        return {"type": self.type, "ranks": list(self.ranks), "message": self.message}


@dataclass(frozen=True)
class FailureInfo:
    """An attempt that failed: when, which ranks, the one-line reason and each rank's
    error."""

    attempt: int | None
    t: float | None
    ranks: tuple[int, ...]
    reason: str
    errors: tuple[ErrorInfo, ...] = ()

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


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _time(value: object) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def run_history(events: Iterable[object], *, driver_live: bool = False) -> RunHistory:
    """Fold ``events`` (in log order) into the run's :class:`RunHistory`."""
    sessions = attempts = 0
    failures: list[FailureInfo] = []
    restarts: list[float] = []
    started_at = last_t = None
    session_open = False
    last_status: str | None = None
    last_error: ErrorInfo | None = None
    for event in events:
        if not isinstance(event, Mapping):
            continue
        kind = event.get("type")
        t = _time(event.get("t"))
        if t is not None:
            last_t = t if last_t is None else max(last_t, t)
        if kind == "session_start":
            sessions += 1
            session_open = True
            last_status, last_error = None, None
            if started_at is None:
                started_at = t
        elif kind == "attempt_start":
            attempts += 1
            if attempts > 1 and t is not None:
                restarts.append(t)
        elif kind == "failure":
            ranks = event.get("ranks", ())
            errors = event.get("errors", ())
            reason = event.get("reason")
            failures.append(FailureInfo(
                attempt=event.get("attempt") if _is_int(event.get("attempt")) else None,
                t=t,
                ranks=tuple(r for r in ranks if _is_int(r))
                if isinstance(ranks, (list, tuple)) else (),
                reason=reason if isinstance(reason, str) else "",
                errors=tuple(e for e in map(ErrorInfo.parse, errors) if e is not None)
                if isinstance(errors, (list, tuple)) else (),
            ))
        elif kind == "session_end":
            session_open = False
            status = event.get("status")
            last_status = status if status in ("finished", "failed", "interrupted") else None
            last_error = ErrorInfo.parse(event.get("error"))
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
