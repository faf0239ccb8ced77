"""Merging the ranks' reports into checkpoints (pure logic, no I/O, no processes).

The n-th ``report()`` of every rank is report n. A report carries a checkpoint when at
least one rank passes one; it is ready to commit once every rank has reached report n and
every rank that passed a checkpoint has finished uploading its part. Conflicts are caught
here, before any data is written where another rank's data is:

* two ranks claiming the same relative path (the second rank's intent is refused, so
  nothing is ever silently overwritten);
* ranks disagreeing on ``checkpoint_dir_name`` or mixing NO_UPLOAD with uploads;
* a directory name already used in this run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from cairn._src.errors import CheckpointCollisionError, CheckpointSkippedError, ReportError
from cairn._src.execution.messages import CheckpointIntent, ReportMessage, UploadedMessage
from cairn._src.storage.location import StorageLocation
from cairn._src.storage.transfer import FileEntry


@dataclass
class PendingReport:
    index: int
    first_arrival: float
    arrived: dict[int, ReportMessage] = field(default_factory=dict)
    intents: dict[int, CheckpointIntent] = field(default_factory=dict)
    claimed: dict[str, int] = field(default_factory=dict)
    uploaded: dict[int, UploadedMessage] = field(default_factory=dict)
    dir_name: str | None = None
    failed: BaseException | None = None

    @property
    def has_checkpoint(self) -> bool:
        return bool(self.intents)


@dataclass(frozen=True)
class ReadyCheckpoint:
    """Everything the checkpoint manager needs to commit one report's checkpoint."""

    index: int
    dir_name: str
    metrics: dict[str, object]
    entries: dict[str, FileEntry]
    ranks: tuple[int, ...]
    reference: StorageLocation | None
    metadata: dict[str, object]
    bytes_uploaded: int


@dataclass(frozen=True)
class Verdict:
    """The answer to one rank's report: proceed with the upload, or refuse."""

    rank: int
    index: int
    error: BaseException | None = None


def describe_ranks(ranks: list[int] | set[int]) -> str:
    """"rank 3" or "ranks 0, 2"."""
    ordered = sorted(ranks)
    label = "rank" if len(ordered) == 1 else "ranks"
    return f"{label} {', '.join(str(r) for r in ordered)}"


class ReportTracker:
    """Follows the reports of one attempt. Not thread-safe: the controller loop owns it."""

    def __init__(self, world_size: int, *, used_dir_names: set[str]) -> None:
        self.world_size = world_size
        self._used = set(used_dir_names)
        self._pending: dict[int, PendingReport] = {}
        self.report_counts: dict[int, int] = dict.fromkeys(range(world_size), 0)
        self._skipped: dict[int, BaseException] = {}
        self.last_index: dict[int, int] = {}

    def on_report(self, message: ReportMessage) -> list[Verdict]:
        """Record a rank's report; the verdicts to send (empty for metric-only reports)."""
        rank, index = message.rank, message.index
        self.report_counts[rank] += 1
        self.last_index[rank] = index
        if index in self._skipped:
            skipped = self._skipped[index]
            return [Verdict(rank, index, skipped)] if message.checkpoint is not None else []
        pending = self._pending.get(index)
        if pending is None:
            pending = self._pending[index] = PendingReport(index, time.monotonic())
        pending.arrived[rank] = message
        intent = message.checkpoint
        if intent is None:
            self._forget_if_metric_only(pending)
            return []
        if pending.failed is not None:
            return [Verdict(rank, index, pending.failed)]
        error = self._check_intent(pending, rank, intent)
        if error is not None:
            pending.failed = error
            others = [r for r in pending.intents if r != rank]
            return [Verdict(r, index, error) for r in [rank, *others]]
        pending.intents[rank] = intent
        if intent.mode == "NO_UPLOAD":
            # The data is already where it will stay: nothing to wait for from this rank.
            pending.uploaded[rank] = UploadedMessage(rank, index, {}, intent.reference, 0, 0.0)
        for path in intent.files:
            pending.claimed[path] = rank
        if pending.dir_name is None:
            pending.dir_name = intent.dir_name
            self._used.add(intent.dir_name)
        return [Verdict(rank, index)]

    def _check_intent(
        self, pending: PendingReport, rank: int, intent: CheckpointIntent
    ) -> BaseException | None:
        if pending.dir_name is None:
            if intent.dir_name in self._used:
                return ReportError(
                    f"report(checkpoint_dir_name={intent.dir_name!r}) on rank {rank}: this name "
                    "is already used by another checkpoint of this run; each checkpoint needs "
                    "a unique checkpoint_dir_name."
                )
        elif intent.dir_name != pending.dir_name:
            first = min(pending.intents)
            return ReportError(
                f"Ranks disagree on checkpoint_dir_name for report {pending.index}: rank "
                f"{first} gave {pending.dir_name!r}, rank {rank} gave {intent.dir_name!r}. "
                "Pass the same checkpoint_dir_name on every rank."
            )
        by_reference = intent.mode == "NO_UPLOAD"
        for other_rank, other in pending.intents.items():
            if (other.mode == "NO_UPLOAD") != by_reference:
                return ReportError(
                    f"Report {pending.index} mixes checkpoint_upload_mode=NO_UPLOAD (rank "
                    f"{other_rank if other.mode == 'NO_UPLOAD' else rank}) with an upload "
                    f"(rank {rank if other.mode == 'NO_UPLOAD' else other_rank}); every rank "
                    "that passes a checkpoint must use the same kind of mode."
                )
            if other.upload_fn != intent.upload_fn:
                with_fn = other_rank if other.upload_fn else rank
                without = rank if other.upload_fn else other_rank
                return ReportError(
                    f"Report {pending.index} mixes checkpoint_upload_fn (rank {with_fn}) with "
                    f"Cairn's own upload (rank {without}); every rank that passes a checkpoint "
                    "must pass the same checkpoint_upload_fn, or none."
                )
            if by_reference and other.reference != intent.reference:
                assert other.reference is not None and intent.reference is not None
                return ReportError(
                    f"NO_UPLOAD checkpoints of report {pending.index} point to different places:"
                    f" rank {other_rank} gave {other.reference.display()}, rank {rank} gave "
                    f"{intent.reference.display()}. Ranks that pass a NO_UPLOAD checkpoint "
                    "must pass the same location (one directory holding every rank's files)."
                )
        for path in intent.files:
            owner = pending.claimed.get(path)
            if owner is not None and owner != rank:
                return CheckpointCollisionError(
                    f"Ranks {min(owner, rank)} and {max(owner, rank)} both wrote {path!r} into "
                    f"the checkpoint of report {pending.index}; ranks must write distinct files "
                    "(for example prefix them with the rank) or pass checkpoint=None on all "
                    "but one rank."
                )
        return None

    def _forget_if_metric_only(self, pending: PendingReport) -> None:
        if len(pending.arrived) == self.world_size and not pending.intents:
            del self._pending[pending.index]

    def mark_used(self, name: str) -> None:
        """``name`` may no longer be a checkpoint_dir_name (it holds committed data)."""
        self._used.add(name)

    def on_uploaded(self, message: UploadedMessage) -> None:
        pending = self._pending.get(message.index)
        if pending is not None:
            pending.uploaded[message.rank] = message

    def skip(self, index: int, reason: str) -> PendingReport | None:
        """Drop a report's checkpoint for good; later parts of it are refused."""
        self._skipped[index] = CheckpointSkippedError(reason)
        return self._pending.pop(index, None)

    def take_ready(self) -> list[ReadyCheckpoint]:
        """Reports whose checkpoint can be committed now, in report order; forgets them."""
        ready: list[ReadyCheckpoint] = []
        for index in sorted(self._pending):
            pending = self._pending[index]
            if pending.failed is not None or not pending.intents:
                continue
            if len(pending.arrived) < self.world_size:
                continue
            if set(pending.uploaded) != set(pending.intents):
                continue
            ready.append(self._merge(pending))
            del self._pending[index]
        return ready

    def _merge(self, pending: PendingReport) -> ReadyCheckpoint:
        entries: dict[str, FileEntry] = {}
        references: dict[int, StorageLocation] = {}
        metadata: dict[str, object] = {}
        for rank in sorted(pending.uploaded):
            uploaded = pending.uploaded[rank]
            entries.update(uploaded.entries)
            reference = uploaded.reference or pending.intents[rank].reference
            if reference is not None:
                references[rank] = reference
            metadata.update(pending.intents[rank].metadata)
        distinct: list[StorageLocation] = []
        for location in references.values():
            if location not in distinct:
                distinct.append(location)
        if len(distinct) > 1:
            raise ReportError(
                f"Report {pending.index}: ranks registered different checkpoint locations ("
                + ", ".join(f"rank {r}: {loc.display()}" for r, loc in references.items())
                + "); "
                "they must register one location."
            )
        assert pending.dir_name is not None
        rank0 = pending.arrived[min(pending.arrived)]
        return ReadyCheckpoint(
            index=pending.index,
            dir_name=pending.dir_name,
            metrics=rank0.metrics,
            entries=entries,
            ranks=tuple(sorted(pending.intents)),
            reference=distinct[0] if distinct else None,
            metadata=metadata,
            bytes_uploaded=sum(u.bytes_written for u in pending.uploaded.values()),
        )

    def overdue(self, timeout_s: float, now: float | None = None) -> tuple[int, list[int]] | None:
        """The oldest checkpoint report some ranks have not reached within ``timeout_s``."""
        now = time.monotonic() if now is None else now
        for index in sorted(self._pending):
            pending = self._pending[index]
            if pending.intents and len(pending.arrived) < self.world_size and (
                now - pending.first_arrival > timeout_s
            ):
                missing = sorted(set(range(self.world_size)) - set(pending.arrived))
                return index, missing
        return None

    def waiting_on(self, rank: int) -> int | None:
        """A checkpoint report that other ranks reached and ``rank`` did not, if any."""
        for index in sorted(self._pending):
            pending = self._pending[index]
            if pending.intents and rank not in pending.arrived:
                return index
        return None

    def pending_dir_names(self) -> list[str]:
        return [p.dir_name for p in self._pending.values() if p.dir_name is not None]
