"""The failure policy: decides whether a failed attempt is retried (pure, no I/O)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from cairn._src.wire.preemption import PreemptionInfo


class FailureDecision(enum.Enum):
    RETRY = "RETRY"
    RAISE = "RAISE"


@dataclass(frozen=True)
class AttemptFailure:
    """Why an attempt failed.

    ``fatal`` marks mistakes a restart would only repeat (bad ``report()`` arguments,
    colliding checkpoint files): they fail the run at once, whatever the budget.
    ``preemption`` is set when the attempt ended because of a preemption notice (its
    workers went after it, or its deadline passed: ``drain_timed_out``); it counts
    against ``max_preemption_failures`` instead of ``max_failures``.
    """

    ranks: tuple[int, ...]
    reason: str
    fatal: bool = False
    preemption: PreemptionInfo | None = None
    drain_timed_out: bool = False


@dataclass(frozen=True)
class FailurePolicy:
    """Retry up to ``max_failures`` times (``-1``: no limit), and preemptions up to
    ``max_preemption_failures`` times, apart (Ray Train's two budgets).

    ``failures_so_far`` counts the failures of the whole run of the kind ``failure`` is
    (preemptions for a preemption), driver restarts included, so a run that keeps
    crashing its driver cannot retry forever.
    """

    max_failures: int
    max_preemption_failures: int = -1

    def budget(self, failure: AttemptFailure) -> int:
        """The budget ``failure`` counts against (``-1``: no limit)."""
        return (self.max_preemption_failures if failure.preemption is not None
                else self.max_failures)

    def decide(self, failure: AttemptFailure, failures_so_far: int) -> FailureDecision:
        if failure.fatal:
            return FailureDecision.RAISE
        budget = self.budget(failure)
        if budget == -1 or failures_so_far < budget:
            return FailureDecision.RETRY
        return FailureDecision.RAISE
