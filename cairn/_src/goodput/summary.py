"""Goodput: the productive fraction of a run's wall time, and where the rest went.

Computed from the run's event log alone, so ``Result`` and ``cairn goodput`` agree and a
run resumed by a new driver is summarized whole. The event types
(:mod:`cairn._src.run.events`, all with ``t``, a Unix time):

* ``session_start`` / ``session_end``: a driver started or finished working on the run;
* ``attempt_start`` (``attempt``), ``workers_ready`` (``attempt``): a worker group was
  started and every worker connected;
* ``train_start`` (``attempt``): the train function started on the first rank;
* ``first_report`` (``attempt``): the first report of the attempt arrived;
* ``blocked`` (``rank``, ``kind``, ``seconds``): a rank was blocked in ``report()``;
* ``commit`` (``index``, ``seconds``, ``bytes``);
* ``failure`` (``attempt``, ``ranks``, ``reason``, ``last_commit_t``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from cairn._src.run.events import (
    AttemptStart,
    Blocked,
    Commit,
    Failure,
    FirstReport,
    SessionEnd,
    SessionStart,
    TrainStart,
    as_events,
)
from cairn._src.text import plural


@dataclass(frozen=True)
class GoodputSummary:
    """Seconds of wall time by category; ``productive`` is what is left for training."""

    wall_s: float
    startup_s: float
    checkpoint_blocked_s: float
    recovery_s: float
    lost_work_s: float
    attempts: int
    failures: int
    uploaded_bytes: int

    @property
    def productive_s(self) -> float:
        lost = self.startup_s + self.checkpoint_blocked_s + self.recovery_s + self.lost_work_s
        return max(0.0, self.wall_s - lost)

    @property
    def goodput(self) -> float:
        """Productive fraction of wall time (0..1)."""
        return self.productive_s / self.wall_s if self.wall_s > 0 else 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "goodput": self.goodput,
            "wall_s": self.wall_s,
            "productive_s": self.productive_s,
            "startup_s": self.startup_s,
            "checkpoint_blocked_s": self.checkpoint_blocked_s,
            "recovery_s": self.recovery_s,
            "lost_work_s": self.lost_work_s,
            "attempts": float(self.attempts),
            "failures": float(self.failures),
            "uploaded_bytes": float(self.uploaded_bytes),
        }

    def format(self) -> str:
        def share(seconds: float) -> str:
            return f"{seconds:8.2f}s {100 * seconds / self.wall_s:5.1f}%" if self.wall_s else "-"

        lines = [
            f"goodput            {100 * self.goodput:5.1f}%  ({plural(self.attempts, 'attempt')}, "
            f"{plural(self.failures, 'failure')})",
            f"wall time          {self.wall_s:8.2f}s",
            f"  productive       {share(self.productive_s)}",
            f"  start-up         {share(self.startup_s)}",
            f"  checkpoint stall {share(self.checkpoint_blocked_s)}",
            f"  recovery         {share(self.recovery_s)}",
            f"  lost work        {share(self.lost_work_s)}",
            f"uploaded           {self.uploaded_bytes / 2**20:.1f} MiB",
        ]
        return "\n".join(lines)


def summarize(events: Iterable[object]) -> GoodputSummary:
    """The goodput of a run from its ``events`` (typed, or records as the log stores them;
    any order)."""
    ordered = sorted(as_events(events), key=lambda e: float(e.t or 0.0))
    wall = startup = recovery = lost = 0.0
    blocked: dict[int, float] = defaultdict(float)
    attempts = failures = uploaded = 0
    session_start: float | None = None
    last_t: float | None = None
    attempt_start: float | None = None
    failed_at: float | None = None
    for event in ordered:
        t = float(event.t or 0.0)
        if isinstance(event, SessionStart):
            if session_start is not None and last_t is not None:
                # The previous driver died without a session_end: count up to its last event.
                wall += last_t - session_start
            session_start = t
            failed_at = None
        elif isinstance(event, AttemptStart):
            attempts += 1
            attempt_start = t
        elif isinstance(event, (TrainStart, FirstReport)) and attempt_start is not None:
            # train_start (every worker connected and about to train) ends start-up and
            # recovery; logs written before it existed fall back to the first report.
            if failed_at is not None:
                recovery += t - failed_at
                failed_at = None
            else:
                startup += t - attempt_start
            attempt_start = None
        elif isinstance(event, Blocked):
            blocked[event.rank or 0] += float(event.seconds or 0.0)
        elif isinstance(event, Commit):
            uploaded += event.bytes or 0
        elif isinstance(event, Failure):
            failures += 1
            failed_at = t
            since = event.last_commit_t or event.attempt_t or t
            lost += max(0.0, t - float(since))
        elif isinstance(event, SessionEnd) and session_start is not None:
            wall += t - session_start
            session_start = None
        last_t = t
    if session_start is not None and last_t is not None:
        wall += last_t - session_start
    mean_blocked = sum(blocked.values()) / len(blocked) if blocked else 0.0
    return GoodputSummary(
        wall_s=wall,
        startup_s=startup,
        checkpoint_blocked_s=mean_blocked,
        recovery_s=recovery,
        lost_work_s=lost,
        attempts=attempts,
        failures=failures,
        uploaded_bytes=uploaded,
    )
