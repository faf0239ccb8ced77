"""What the driver's live view shows (:mod:`live_view`), folded from the controller's hooks:
pure state and formatting, no threads, no I/O."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from cairn._src.goodput.summary import GoodputSummary, merged_stretches, summarize
from cairn._src.run.events import (
    AttemptStart,
    Commit,
    Event,
    Failure,
    SessionEnd,
    SessionStart,
    TrainEnd,
    TrainStart,
    ValidationFinished,
    as_events,
)
from cairn._src.text import plural

_METRICS_SHOWN = 4
_STEP_KEYS = ("step", "epoch")


# --- formatting (pure) ---------------------------------------------------------------------


def format_bytes(count: float) -> str:
    """``"512 B"``, ``"1.5 KiB"``, ``"256.0 MiB"``, ``"1.2 GiB"``."""
    if count < 1024:
        return f"{int(count)} B"
    value = float(count)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    return f"{value:.1f} {unit}"


def format_rate(count: float, seconds: float) -> str:
    """Bytes per second as ``"12.5 MiB/s"``; ``"-"`` when ``seconds`` is not positive."""
    if seconds <= 0:
        return "-"
    return f"{format_bytes(count / seconds)}/s"


def format_age(seconds: float) -> str:
    """``"0s"``, ``"42s"``, ``"2m05s"``, ``"1h02m"``."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def format_value(value: Any) -> str:
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    text = str(value)
    return text if len(text) <= 24 else text[:23] + "…"


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    line = lines[0] if lines else ""
    return line if len(line) <= 100 else line[:99] + "…"


# --- state (pure: no threads, no I/O) ------------------------------------------------------


@dataclass
class PendingUpload:
    """A report some rank passed a checkpoint with, not committed yet."""

    index: int
    files: dict[str, int] = field(default_factory=dict)
    by_reference: bool = False
    uploaded_bytes: int = 0
    uploaded_seconds: float = 0.0
    ranks_uploaded: set[int] = field(default_factory=set)
    ranks_reporting: set[int] = field(default_factory=set)

    def describe(self) -> str:
        if self.by_reference and not self.files:
            return f"report {self.index} (by reference)"
        text = (f"report {self.index} ({plural(len(self.files), 'file')}, "
                f"{format_bytes(sum(self.files.values()))}")
        if self.ranks_uploaded:
            text += (f", {len(self.ranks_uploaded)} of {len(self.ranks_reporting)} ranks "
                     f"uploaded, {format_rate(self.uploaded_bytes, self.uploaded_seconds)}")
        return text + ")"


@dataclass
class LastCommit:
    dir_name: str
    index: int
    bytes: int
    seconds: float
    at: float

    @property
    def throughput(self) -> str:
        return format_rate(self.bytes, self.seconds)


class LiveState:
    """What the view shows, folded from the controller's hooks. Not thread-safe: the
    :class:`LiveView` guards it with its lock. Each ``on_*`` method returns the event
    lines it produced (shown at level 2)."""

    def __init__(self, num_workers: int, *, started_at: float,
                 earlier_events: Iterable[object] = (),
                 upload_failure_policy: str = "fail") -> None:
        self.num_workers = num_workers
        self.upload_failure_policy = upload_failure_policy
        self.report_index: int | None = None
        self.metrics: dict[str, Any] = {}
        self.pending: dict[int, PendingUpload] = {}
        self.last_commit: LastCommit | None = None
        self.commits = 0
        self.skipped = 0
        self.restarts = 0
        self.last_restart_reason: str | None = None
        self.attempt: int | None = None
        self.finished = False
        self._failure_reason: str | None = None
        self._validations: dict[str, int] = {}
        self._train_ended = False  # every rank's train function of the attempt returned
        earlier = as_events(earlier_events)
        self._earlier = summarize(earlier) if earlier else None
        # This session's events, in the form summary.py reads; blocked time and bytes are
        # kept apart so the list holds no event per report.
        self._events: list[Event] = [SessionStart(t=started_at)]
        # The stretches in which some rank was blocked in report(): up to the last commit
        # (kept, merged again whenever the list has doubled since its last merge: about one
        # a report however many ranks blocked, at a cost per commit that does not grow with
        # the run), and since (lost work, not a stall, if the attempt fails before the next
        # commit; as summary.py counts it).
        self._stalls: list[tuple[float, float]] = []
        self._merged_stalls = 0
        self._stalls_since_commit: list[tuple[float, float]] = []
        self._last_commit_at = started_at
        self._uploaded = 0

    # --- hooks ---------------------------------------------------------------------------

    def on_attempt_start(self, number: int, at: float, resume: str | None) -> list[str]:
        self.attempt = number
        self._train_ended = False
        self._events.append(AttemptStart(t=at, attempt=number))
        self.pending.clear()
        if self._failure_reason is None:
            return []
        self.restarts += 1
        self.last_restart_reason = self._failure_reason
        self._failure_reason = None
        return [f"restart {self.restarts}: attempt {number} starts from "
                f"{resume or 'scratch'} (after: {self.last_restart_reason})"]

    def on_train_start(self, at: float) -> list[str]:
        self._events.append(TrainStart(t=at))
        return []

    def on_train_end(self, at: float) -> list[str]:
        self._train_ended = True
        self._events.append(TrainEnd(t=at))
        return []

    def on_blocked(self, rank: int, seconds: float, at: float) -> list[str]:
        start = at - max(0.0, seconds)
        cut = min(at, max(start, self._last_commit_at))
        self._stalls.append((start, cut))
        self._stalls_since_commit.append((cut, at))
        return []

    def on_report(self, rank: int, index: int, metrics: dict[str, Any],
                  files: dict[str, int] | None, by_reference: bool) -> list[str]:
        if rank == 0:
            self.report_index = index if self.report_index is None else max(
                self.report_index, index)
            self.metrics = dict(metrics)
        if files is not None or by_reference:
            pending = self.pending.setdefault(index, PendingUpload(index))
            pending.files.update(files or {})
            pending.by_reference = pending.by_reference or by_reference
            pending.ranks_reporting.add(rank)
        return []

    def on_uploaded(self, rank: int, index: int, bytes_written: int,
                    seconds: float) -> list[str]:
        pending = self.pending.get(index)
        if pending is not None and rank not in pending.ranks_uploaded:
            pending.ranks_uploaded.add(rank)
            pending.uploaded_bytes += bytes_written
            # Ranks upload side by side: the slowest one bounds the report's transfer.
            pending.uploaded_seconds = max(pending.uploaded_seconds, seconds)
        return []

    def on_upload_failed(self, rank: int, index: int, error: str) -> list[str]:
        if self.upload_failure_policy != "skip":
            return []  # the attempt fails: the failure line tells
        if self.pending.pop(index, None) is None:
            return []  # a second rank's failure of a report already skipped
        self.skipped += 1
        return [f"skipped the checkpoint of report {index}: rank {rank} could not upload it "
                f"({_first_line(error)})"]

    def on_committed(self, index: int, dir_name: str, bytes_uploaded: int,
                     commit_seconds: float, at: float, validation: bool) -> list[str]:
        pending = self.pending.pop(index, None)
        # Throughput over the upload when the ranks said how long it took, else over the
        # commit, which is all the driver knows.
        seconds = (pending.uploaded_seconds if pending is not None
                   and pending.uploaded_seconds > 0 else commit_seconds)
        self.last_commit = LastCommit(dir_name, index, bytes_uploaded, seconds, at)
        self.commits += 1
        # What a rank was blocked after the commit (its report returns once committed)
        # stays since-commit: lost work if the attempt fails before the next one.
        self._stalls += [(a, min(b, at)) for a, b in self._stalls_since_commit if a < at]
        self._stalls_since_commit = [(max(a, at), b) for a, b in self._stalls_since_commit
                                     if b > at]
        if len(self._stalls) > 2 * self._merged_stalls + 64:
            self._stalls = merged_stretches(self._stalls)
            self._merged_stalls = len(self._stalls)
        self._last_commit_at = max(self._last_commit_at, at)
        self._uploaded += bytes_uploaded
        if validation:
            self._validations[dir_name] = index
        return [f"committed {dir_name} (report {index}, {format_bytes(bytes_uploaded)}, "
                f"{self.last_commit.throughput})"]

    def on_commit_failed(self, index: int, error: str) -> list[str]:
        self.pending.pop(index, None)
        return [f"the commit of report {index} failed: {_first_line(error)}"]

    def on_failure(self, attempt: int, at: float, reason: str, last_commit_t: float,
                   counted: bool) -> list[str]:
        self._failure_reason = _first_line(reason)
        self.pending.clear()
        # The attempt's stalls since its last commit are in the work it lost.
        self._stalls_since_commit.clear()
        self._events.append(Failure(t=at, attempt=attempt, last_commit_t=last_commit_t))
        return [f"attempt {attempt} failed{'' if counted else ' (not counted)'}: "
                f"{self._failure_reason}"]

    def pending_validations(self) -> list[str]:
        return sorted(self._validations)

    def on_validation_finished(self, dir_name: str, status: str, at: float) -> list[str]:
        index = self._validations.pop(dir_name, None)
        if index is None:
            return []
        if self._train_ended:  # the driver waited for it: validation wait, not training
            self._events.append(ValidationFinished(t=at, dir_name=dir_name))
        return [f"validation of {dir_name} (report {index}) finished: {status}"]

    # --- views ---------------------------------------------------------------------------

    def goodput(self, now: float) -> GoodputSummary:
        """This session's goodput up to ``now``; a start-up or recovery still under way
        counts up to ``now``."""
        ongoing: list[Event] = []
        last = next((e for e in reversed(self._events)
                     if isinstance(e, (AttemptStart, TrainStart, Failure))), None)
        if isinstance(last, Failure):
            ongoing.append(AttemptStart(t=now))
        if isinstance(last, (Failure, AttemptStart)):
            ongoing.append(TrainStart(t=now))
        if self._train_ended and self._validations:
            ongoing.append(ValidationFinished(t=now))
        summary = summarize([*self._events, *ongoing, Commit(t=now, bytes=self._uploaded),
                             SessionEnd(t=now)])
        stalls = merged_stretches([*self._stalls, *self._stalls_since_commit])
        if not stalls:
            return summary
        return dataclasses.replace(summary,
                                   checkpoint_blocked_s=sum(b - a for a, b in stalls))

    def goodput_share(self, now: float) -> float | None:
        """Productive fraction of wall time so far, earlier sessions of the run included."""
        current = self.goodput(now)
        wall = current.wall_s + (self._earlier.wall_s if self._earlier else 0.0)
        if wall <= 0:
            return None
        productive = current.productive_s + (self._earlier.productive_s if self._earlier
                                             else 0.0)
        return productive / wall

    def step_text(self) -> str:
        if self.report_index is None:
            return "no report yet"
        parts = [f"report {self.report_index}"]
        parts += [f"{key}={format_value(self.metrics[key])}" for key in _STEP_KEYS
                  if key in self.metrics]
        others = [(k, v) for k, v in self.metrics.items() if k not in _STEP_KEYS
                  and isinstance(v, (int, float, str))]
        parts += [f"{key}={format_value(value)}" for key, value in others[:_METRICS_SHOWN]]
        return " ".join(parts)

    def uploads_text(self) -> str:
        if not self.pending:
            return "none pending"
        items = [self.pending[i].describe() for i in sorted(self.pending)]
        shown = "; ".join(items[:2]) + (f"; +{len(items) - 2} more" if len(items) > 2 else "")
        return f"{len(items)} pending: {shown}"

    def commit_text(self, now: float) -> str:
        commit = self.last_commit
        if commit is None:
            return "no commit yet"
        text = (f"{commit.dir_name} {format_bytes(commit.bytes)} "
                f"{format_age(now - commit.at)} ago")
        if commit.bytes:
            text += f" ({commit.throughput})"
        return text

    def restarts_text(self) -> str:
        text = plural(self.restarts, "restart")
        if self.last_restart_reason:
            text += f" (last: {self.last_restart_reason})"
        return text

    def goodput_text(self, now: float) -> str:
        share = self.goodput_share(now)
        return "-" if share is None else f"{100 * share:.1f}%"

    def rows(self, now: float) -> list[tuple[str, str]]:
        return [("step", self.step_text()), ("uploads", self.uploads_text()),
                ("last commit", self.commit_text(now)), ("restarts", self.restarts_text()),
                ("goodput", self.goodput_text(now))]

    def status_line(self, now: float) -> str:
        """The plain status line (stderr not a terminal)."""
        return (f"cairn: {self.step_text()} | uploads: {self.uploads_text()} | last commit: "
                f"{self.commit_text(now)} | {self.restarts_text()} | goodput "
                f"{self.goodput_text(now)}")


# --- notices: what fit() says at the default level --------------------------------------


def start_notice(name: str, where: str, *, attempts: int, checkpoints: int,
                 resume: str | None, resume_report: int | None, finished_before: bool) -> str:
    """Which run ``fit()`` starts or continues, and from which checkpoint."""
    if attempts == 0 and checkpoints == 0:
        return f"starting run {name!r} at {where}"
    origin = (f"{resume} (report {resume_report})" if resume is not None
              else "scratch (no committed checkpoint yet)")
    if finished_before:
        return (f"run {name!r} at {where} already finished in an earlier fit(); this fit() "
                f"continues it from {origin}: a train function that resumes where it ended "
                "returns at once, and the Result holds the run's checkpoints and the metrics "
                "of its last report (a new name starts a new run)")
    return f"continuing run {name!r} at {where} from {origin}, attempt {attempts + 1}"


def give_up_notice(name: str, *, attempt: int, max_failures: int, fatal: bool,
                   latest: str | None, argument: str = "max_failures") -> str:
    """Why a failed attempt ends the run, and what to do next (``argument``: the budget
    that is spent, ``max_failures`` or ``max_preemption_failures``)."""
    rerun = (f"running the script again continues run {name!r} from "
             f"{latest or 'scratch (no committed checkpoint)'}")
    if fatal:
        return (f"attempt {attempt} failed on a mistake a restart would repeat; once it is "
                f"fixed, {rerun}")
    if max_failures == 0:
        return (f"attempt {attempt} failed and FailureConfig({argument}=0) allows no "
                f"restart: RunConfig(failure_config=FailureConfig({argument}=N)) restarts "
                f"up to N times from the latest checkpoint (-1: no limit); {rerun}")
    return (f"attempt {attempt} failed and the {plural(max_failures, 'restart')} "
            f"FailureConfig({argument}={max_failures}) allows are spent; {rerun}")
