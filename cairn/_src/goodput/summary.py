"""Goodput: the productive fraction of a run's wall time, and where the rest went.

Computed from the run's event log alone, so ``Result`` and ``cairn goodput`` agree and a
run resumed by a new driver is summarized whole. The event types
(:mod:`cairn._src.run.events`, all with ``t``, a Unix time):

* ``session_start`` / ``session_end``: a driver started or finished working on the run;
* ``attempt_start`` (``attempt``), ``workers_ready`` (``attempt``): a worker group was
  started and every worker connected;
* ``train_start`` (``attempt``): the train function started on the first rank;
* ``train_end`` (``attempt``): the train function returned on every rank;
* ``first_report`` (``attempt``): the first report of the attempt arrived;
* ``blocked`` (``rank``, ``kind``, ``seconds``): a rank was blocked in ``report()``;
* ``commit`` (``index``, ``seconds``, ``bytes``);
* ``failure`` (``attempt``, ``ranks``, ``reason``, ``last_commit_t``);
* ``validation_finished`` (``dir_name``): the validation of a checkpoint finished.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cairn._src.goodput.timeline import AttemptSpan, ordered_events, stall_seconds, walk
from cairn._src.run.events import (
    AttemptStart,
    Commit,
    Event,
    Failure,
    SessionEnd,
    SessionStart,
    as_events,
)
from cairn._src.text import plural


@dataclass(frozen=True)
class GoodputSummary:
    """Seconds of wall time by category; ``productive`` is what is left for training.
    ``checkpoint_blocked_s``: the wall time during which at least one rank was blocked in
    ``report()`` (the job's stall: ranks in step, as in data-parallel training, wait at
    their next collective for a rank that is blocked; a stall of several ranks at once
    counts once). ``validation_wait_s``: the driver waited for validations after the train
    function had returned on every rank (0 for logs written before Cairn recorded that
    return)."""

    wall_s: float
    startup_s: float
    checkpoint_blocked_s: float
    recovery_s: float
    lost_work_s: float
    attempts: int
    failures: int
    uploaded_bytes: int
    validation_wait_s: float = 0.0

    @property
    def productive_s(self) -> float:
        lost = (self.startup_s + self.checkpoint_blocked_s + self.recovery_s + self.lost_work_s
                + self.validation_wait_s)
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
            "validation_wait_s": self.validation_wait_s,
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
            f"  validation wait  {share(self.validation_wait_s)}",
            f"uploaded           {self.uploaded_bytes / 2**20:.1f} MiB",
        ]
        return "\n".join(lines)


def summarize(events: Iterable[object]) -> GoodputSummary:
    """The goodput of a run from its ``events`` (typed, or records as the log stores them;
    any order).

    The attempts are found as :func:`~cairn._src.goodput.timeline.build_timeline` finds
    them, so the summary and the chart agree: start-up or recovery lasts until training
    starts (up to the attempt's end when it never does, as in a crash loop); a failure
    loses the work from its last commit or, if later, the train start; a rank's stall in
    that lost work is lost work, not a stall too. Once the train function has returned on
    every rank, the wait for the validations that finish after that is validation wait,
    not training. The checkpoint stall is the time that some rank's lane of the timeline
    shows as a stall (:func:`_stalled`)."""
    typed = as_events(events)
    ordered = ordered_events(typed)
    found = walk(ordered)
    startup = recovery = lost = waited = 0.0
    for span in found.spans:
        begin, trained, lost_from, end = span.phases()
        if span.recovering_from is None:
            startup += trained - begin
        else:
            recovery += trained - begin
        lost += end - lost_from
        wait_from, wait_until = span.validation_wait()
        waited += wait_until - wait_from
    return GoodputSummary(
        wall_s=_wall(ordered),
        startup_s=startup,
        checkpoint_blocked_s=_stalled(found.spans),
        recovery_s=recovery,
        lost_work_s=lost,
        attempts=sum(isinstance(e, AttemptStart) for e in typed),
        # Against max_failures: not preemptions, nor a restart after damage at resume.
        failures=sum(isinstance(e, Failure) and e.counted for e in typed),
        uploaded_bytes=sum(e.bytes or 0 for e in typed if isinstance(e, Commit)),
        validation_wait_s=waited,
    )


def _stalled(spans: Iterable[AttemptSpan]) -> float:
    """The seconds during which at least one rank was blocked in ``report()``, as the
    timeline paints them (:func:`~.timeline.stall_seconds`). Within start-up or lost work,
    or in the validation wait (which a rank whose train function returned cannot be
    blocked in), a stall is counted as that, once."""
    return sum(stall_seconds(span) for span in spans)


def merged_stretches(pieces: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of the ``(start, end)`` stretches ``pieces``, as disjoint stretches in
    time order (an empty or reversed piece covers nothing)."""
    merged: list[tuple[float, float]] = []
    for a, b in sorted(piece for piece in pieces if piece[1] > piece[0]):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def _wall(ordered: Iterable[tuple[float, Event]]) -> float:
    """The seconds drivers worked on the run: each session from its start to its end, or
    to its last event when its driver died without a word."""
    wall = 0.0
    session_start: float | None = None
    last_t: float | None = None
    for t, event in ordered:
        if isinstance(event, SessionStart):
            if session_start is not None and last_t is not None:
                # The previous driver died without a session_end: count up to its last event.
                wall += last_t - session_start
            session_start = t
        elif isinstance(event, SessionEnd) and session_start is not None:
            wall += t - session_start
            session_start = None
        last_t = t
    if session_start is not None and last_t is not None:
        wall += last_t - session_start
    return wall
