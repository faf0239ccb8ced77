"""The failure policy: decides whether a failed attempt is retried (pure, no I/O)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class FailureDecision(enum.Enum):
    RETRY = "RETRY"
    RAISE = "RAISE"


@dataclass(frozen=True)
class AttemptFailure:
    """Why an attempt failed.

    ``fatal`` marks mistakes a restart would only repeat (bad ``report()`` arguments,
    colliding checkpoint files): they fail the run at once, whatever the budget.
    """

    ranks: tuple[int, ...]
    reason: str
    fatal: bool = False


@dataclass(frozen=True)
class FailurePolicy:
    """Retry up to ``max_failures`` times (``-1``: no limit).

    ``failures_so_far`` counts the failures of the whole run, driver restarts included, so
    a run that keeps crashing its driver cannot retry forever.
    """

    max_failures: int

    def decide(self, failure: AttemptFailure, failures_so_far: int) -> FailureDecision:
        if failure.fatal:
            return FailureDecision.RAISE
        if self.max_failures == -1 or failures_so_far < self.max_failures:
            return FailureDecision.RETRY
        return FailureDecision.RAISE
