"""Checks that every rank keeps reporting in step (pure logic, no processes).

Ranks must call ``report()`` the same number of times. Two ways they may not:

* a rank never reaches a checkpoint report the others made (a hang, or a skipped call):
  after ``collective_timeout_s`` the ranks that did not arrive are named;
* a rank finishes while others wait at a checkpoint report, or ranks finish with
  different report counts: a mistake in the training code, so no restart is attempted.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from cairn._src.controller.reports import ReportTracker, describe_ranks
from cairn._src.errors import CollectiveTimeoutError, ReportError


@dataclass(frozen=True)
class ProgressProblem:
    rank: int
    summary: str
    fatal: bool


def check_progress(
    tracker: ReportTracker, done: Collection[int], *, num_workers: int, timeout_s: float,
    now: float | None = None,
) -> ProgressProblem | None:
    """The first problem with the ranks' progress, or None while all is well."""
    overdue = tracker.overdue(timeout_s, now)
    if overdue is not None:
        index, missing = overdue
        arrived = sorted(set(range(tracker.world_size)) - set(missing))
        return ProgressProblem(missing[0], str(CollectiveTimeoutError(
            f"{describe_ranks(missing)} did not reach report {index} within "
            f"{timeout_s:g}s of {describe_ranks(arrived)}: every rank must call "
            "report() the same number of times (FailureConfig.collective_timeout_s)."
        )), fatal=False)
    for rank in sorted(done):
        waiting = tracker.waiting_on(rank)
        if waiting is not None:
            return _diverged(rank, f"rank {rank} finished after {tracker.report_counts[rank]} "
                             f"reports without reaching checkpoint report {waiting}, which "
                             "other ranks reported")
    counts = tracker.report_counts
    if len(done) == num_workers and len(set(counts.values())) > 1:
        detail = ", ".join(f"rank {r}: {c}" for r, c in sorted(counts.items()))
        return _diverged(min(done), f"ranks reported different numbers of times ({detail})")
    return None


def _diverged(rank: int, detail: str) -> ProgressProblem:
    return ProgressProblem(rank, str(ReportError(
        f"Report counts diverge: {detail}. Every rank must call report() the same number of "
        "times.")), fatal=True)
