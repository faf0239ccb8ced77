"""Merging the ranks' reports into checkpoints (pure logic, no I/O, no processes).

The n-th ``report()`` of every rank is report n. A report carries a checkpoint when at
least one rank passes one; it is ready to commit once every rank has reached report n and
every rank that passed a checkpoint has finished uploading its part. A rank uploads its own
directory as soon as it reports (a rank that dies later does not take that part with it).
Conflicts are caught here, before any data is written where another rank's data is:

* two ranks claiming the same relative path: the rank that claimed it first uploads it,
  the other uploads nothing for that path and sends its own size and checksum; the merge
  compares them and refuses the report when they differ, so nothing is ever silently
  overwritten. Identical copies (data-parallel replicas saving the same ``model.pt``) are
  stored once;
* ranks that report one directory of one machine (the same ``CheckpointIntent.source``;
  Ray Train's pattern of every rank writing its shard into one directory): the first of
  them uploads what it sees at once, but another rank may still be writing its shard
  there. The others wait until every rank has reached the report and that upload has
  finished; then one of them lists the directory again and uploads it whole, in place of
  the first upload, and the rest upload nothing;
* ranks disagreeing on ``checkpoint_dir_name`` (also a rank that names the directory but
  passes no checkpoint) or mixing NO_UPLOAD with uploads;
* a directory name already used in this run.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from cairn._src.checkpoint.views import ReadyCheckpoint
from cairn._src.errors import (
    CheckpointCollisionError,
    CheckpointSkippedError,
    ReportError,
)
from cairn._src.run.report_checks import check_score_attribute, is_nan_score
from cairn._src.storage.checksum import WrittenFile
from cairn._src.storage.location import StorageLocation
from cairn._src.storage.transfer import FileEntry
from cairn._src.wire.messages import (
    CheckpointIntent,
    ReportMessage,
    UploadedMessage,
    VanishedFiles,
)

logger = logging.getLogger(__name__)


@dataclass
class PendingReport:
    index: int
    first_arrival: float
    arrived: dict[int, ReportMessage] = field(default_factory=dict)
    intents: dict[int, CheckpointIntent] = field(default_factory=dict)
    # path -> the rank that claimed it first (it, or its directory's final uploader,
    # uploads it).
    claimed: dict[str, int] = field(default_factory=dict)
    # rank -> paths of its intent another rank uploads: it sends their checksums instead.
    duplicates: dict[int, tuple[str, ...]] = field(default_factory=dict)
    # source -> ranks that reported that directory, in arrival order.
    sources: dict[str, list[int]] = field(default_factory=dict)
    # Ranks waiting for their shared directory to be complete (no verdict sent yet).
    held: set[int] = field(default_factory=set)
    # rank -> the rank whose upload of their shared directory replaces this rank's part.
    replaced_by: dict[int, int] = field(default_factory=dict)
    # Ranks that listed their shared directory again; their checksums cover what they
    # found then.
    relisting: set[int] = field(default_factory=set)
    uploaded: dict[int, UploadedMessage] = field(default_factory=dict)
    dir_name: str | None = None
    # rank -> checkpoint_dir_name given by a rank that passed no checkpoint.
    named: dict[int, str] = field(default_factory=dict)
    failed: BaseException | None = None

    @property
    def has_checkpoint(self) -> bool:
        return bool(self.intents)

    @property
    def own_upload(self) -> bool:
        """Whether Cairn's own uploads write its directory: not a checkpoint registered
        where it is (NO_UPLOAD, or what a ``checkpoint_upload_fn`` put there), whose
        directory names the user's data, never a partial upload Cairn may delete."""
        return any(i.mode != "NO_UPLOAD" and not i.upload_fn for i in self.intents.values())


@dataclass(frozen=True)
class Verdict:
    """The answer to one rank's report: proceed with the upload, or refuse.

    ``duplicates``: paths another rank uploads; this rank sends its checksums instead.
    ``shared``: "" (this rank uploads the files it listed), "upload" (it lists its
    directory, which other ranks reported too, again and uploads it whole, except
    ``duplicates``; of ``stale``, what an earlier upload of it wrote (path -> entry), it
    deletes what is gone and does not write again what is unchanged) or "skip" (another
    rank uploads this directory: upload nothing).
    ``announce``: the explicit ``checkpoint_dir_name`` whose upload starts now, or None.
    """

    rank: int
    index: int
    error: BaseException | None = None
    duplicates: tuple[str, ...] = ()
    shared: str = ""
    announce: str | None = None
    stale: dict[str, FileEntry] = field(default_factory=dict)


def describe_ranks(ranks: list[int] | set[int]) -> str:
    """"rank 3" or "ranks 0, 2"."""
    ordered = sorted(ranks)
    label = "rank" if len(ordered) == 1 else "ranks"
    return f"{label} {', '.join(str(r) for r in ordered)}"


class NanScoreWarning:
    """Logs one warning, the first time a checkpoint's score attribute is NaN: the
    checkpoint is committed and ranks as the worst, as in Ray Train (a diverged fp16 step
    reports a NaN loss; the run goes on). One object per run, which the trackers of its
    attempts share; a tracker given none makes its own (one warning per attempt). Not
    thread-safe: the controller loop owns it."""

    def __init__(self) -> None:
        self.warned = False

    def note(self, ready: ReadyCheckpoint, attribute: str | None) -> None:
        if self.warned or not is_nan_score(ready.metrics, attribute):
            return
        self.warned = True
        logger.warning(
            "The checkpoint_score_attribute %r of %s (report %d) is NaN: the checkpoint is "
            "committed and ranks as the worst, whatever checkpoint_score_order (num_to_keep "
            "drops it first; it is never the best checkpoint), as in Ray Train. Later NaN "
            "scores of this run are not logged.", attribute, ready.dir_name, ready.index)


class ReportTracker:
    """Follows the reports of one attempt. Not thread-safe: the controller loop owns it."""

    def __init__(self, world_size: int, *, used_dir_names: set[str],
                 score_attribute: str | None = None, first_index: int = 1,
                 nan_warning: NanScoreWarning | None = None) -> None:
        self.world_size = world_size
        # The attempt's first report index: a rank that has not reported yet in this
        # attempt has reached the report before it (resumed there), not report 0.
        self.first_index = first_index
        # CheckpointConfig.checkpoint_score_attribute: rank 0's metrics, those a checkpoint
        # keeps, must hold it (_score_missing).
        self._score_attribute = score_attribute
        # The run's (shared by its attempts): warns of the first NaN score.
        self._nan_warning = nan_warning if nan_warning is not None else NanScoreWarning()
        self._used = set(used_dir_names)
        self._pending: dict[int, PendingReport] = {}
        self.report_counts: dict[int, int] = dict.fromkeys(range(world_size), 0)
        self._skipped: dict[int, BaseException] = {}
        self._refused: list[Verdict] = []
        self._vanished: list[VanishedFiles] = []
        # Handed to the commit, not yet committed (or failed): see on_committed(); each
        # with its directory when Cairn's own uploads wrote it (for abandon()).
        self._committing: dict[int, str | None] = {}
        # Directories of reports taken for the commit and never handed to it (abandon()).
        self._abandoned: list[str] = []
        self.last_index: dict[int, int] = {}
        # Reports that changed since take_ready() last looked: only a rank's report or
        # upload can make one ready, so take_ready() costs O(changed), not O(pending), when
        # ranks drift far apart and keep many metric-only reports pending.
        self._changed: set[int] = set()

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
        self._changed.add(index)
        intent = message.checkpoint
        if intent is None:
            return self._on_metric_only(pending, message)
        if pending.failed is not None:
            return [Verdict(rank, index, pending.failed)]
        error = self._check_intent(pending, rank, intent)
        if error is not None:
            return self._refuse(pending, error, first=rank)
        pending.intents[rank] = intent
        if intent.mode == "NO_UPLOAD":
            # The data is already where it will stay: nothing to wait for from this rank.
            pending.uploaded[rank] = UploadedMessage(rank, index, {}, intent.reference, 0, 0.0,
                                                     written=intent.written)
        if pending.dir_name is None:
            pending.dir_name = intent.dir_name
            self._used.add(intent.dir_name)
        announce = intent.dir_name if intent.explicit_dir_name and (
            intent.mode != "NO_UPLOAD") else None
        sharing = pending.sources.setdefault(intent.source, []) if intent.source else []
        sharing.append(rank)
        verdicts: list[Verdict] = []
        if len(sharing) > 1:
            # Another rank reported this directory: it may still have been writing into it
            # then, and its part now waits for the directory to be complete.
            pending.held.add(rank)
        else:
            duplicates = tuple(sorted(p for p in intent.files if p in pending.claimed))
            if duplicates:
                pending.duplicates[rank] = duplicates
            verdicts.append(Verdict(rank, index, duplicates=duplicates, announce=announce))
        for path in intent.files:
            pending.claimed.setdefault(path, rank)
        return verdicts + self._release(pending)

    def _release(self, pending: PendingReport) -> list[Verdict]:
        """The go-ahead for ranks that share a directory, once it is complete.

        That is once every rank has reached the report (so every rank that writes into
        the directory has written) and the upload its first reporter started at once has
        finished (so no two ranks write one path). The lowest waiting rank lists the
        directory again and uploads it whole, in place of that first upload; the other
        waiting ranks upload nothing.
        """
        if (not pending.held or pending.failed is not None
                or len(pending.arrived) < self.world_size):
            return []
        verdicts: list[Verdict] = []
        for members in pending.sources.values():
            first, waiting = members[0], [r for r in members[1:] if r in pending.held]
            if not waiting or first not in pending.uploaded:
                continue
            final = min(waiting)
            group = set(members)
            intent = pending.intents[final]
            announce = intent.dir_name if intent.explicit_dir_name else None
            elsewhere = tuple(sorted(p for p, r in pending.claimed.items() if r not in group))
            if elsewhere:
                pending.duplicates[final] = elsewhere
            stale = dict(pending.uploaded[first].entries)
            pending.relisting.add(final)
            for rank in members:
                if rank != final:
                    pending.replaced_by[rank] = final
            for rank in sorted(waiting):
                pending.held.discard(rank)
                if rank == final:
                    verdicts.append(Verdict(rank, pending.index, duplicates=elsewhere,
                                            shared="upload", announce=announce, stale=stale))
                else:
                    verdicts.append(Verdict(rank, pending.index, shared="skip"))
        return verdicts

    def _on_metric_only(self, pending: PendingReport, message: ReportMessage) -> list[Verdict]:
        if message.dir_name is not None:
            pending.named[message.rank] = message.dir_name
            if pending.failed is None and pending.dir_name is not None and (
                message.dir_name != pending.dir_name
            ):
                return self._refuse(pending, self._disagreement(
                    pending, message.rank, message.dir_name), first=message.rank)
        if len(pending.arrived) == self.world_size and not pending.intents:
            if pending.named:
                logger.warning(
                    "Report %d: %s gave checkpoint_dir_name %s without a checkpoint and no "
                    "rank passed one; the report saves no checkpoint.", pending.index,
                    describe_ranks(set(pending.named)), sorted(set(pending.named.values())))
            del self._pending[pending.index]
            return []
        return self._release(pending)

    def _refuse(self, pending: PendingReport, error: BaseException, *,
                first: int) -> list[Verdict]:
        """Fail the report: every rank that passed a checkpoint (or named one) is told."""
        pending.failed = error
        others = sorted((set(pending.intents) | set(pending.named)) - {first})
        return [Verdict(r, pending.index, error) for r in [first, *others]]

    def _disagreement(self, pending: PendingReport, rank: int, given: str) -> ReportError:
        first = min(pending.intents) if pending.intents else min(pending.named)
        first_name = pending.dir_name if pending.intents else pending.named[first]
        return ReportError(
            f"Ranks disagree on checkpoint_dir_name for report {pending.index}: rank "
            f"{first} gave {first_name!r}, rank {rank} gave {given!r}. "
            "Pass the same checkpoint_dir_name on every rank."
        )

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
            return self._disagreement(pending, rank, intent.dir_name)
        named = {r: n for r, n in pending.named.items() if n != intent.dir_name}
        if named:
            # A rank without a checkpoint named the directory; this rank's differs.
            namer = min(named)
            return ReportError(
                f"Ranks disagree on checkpoint_dir_name for report {pending.index}: rank "
                f"{namer} gave {named[namer]!r} (without a checkpoint), rank {rank} gave "
                f"{intent.dir_name!r}. Pass the same checkpoint_dir_name on every rank."
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
        return None

    def mark_used(self, name: str) -> None:
        """``name`` may no longer be a checkpoint_dir_name (it holds committed data)."""
        self._used.add(name)

    def on_uploaded(self, message: UploadedMessage) -> list[Verdict]:
        """Record a rank's finished part; the verdicts it unblocks (a shared directory)."""
        pending = self._pending.get(message.index)
        if pending is None:
            return []
        pending.uploaded[message.rank] = message
        self._changed.add(message.index)
        return self._release(pending)

    def skip(self, index: int, reason: str) -> tuple[PendingReport | None, list[Verdict]]:
        """Drop a report's checkpoint for good; later parts of it are refused. The report
        (None if it was not pending), and the refusals to send to the ranks still waiting
        for a verdict (held for a shared directory): nothing else would ever answer them."""
        error = self._skipped[index] = CheckpointSkippedError(reason)
        pending = self._pending.pop(index, None)
        held = sorted(pending.held) if pending is not None else []
        return pending, [Verdict(rank, index, error) for rank in held]

    def take_ready(self) -> list[ReadyCheckpoint]:
        """Reports whose checkpoint can be committed now, in report order; forgets them.

        A report whose ranks uploaded different content under one path is not returned:
        it fails, and :meth:`take_refused` gives the verdicts to send.
        """
        ready: list[ReadyCheckpoint] = []
        changed, self._changed = self._changed, set()
        for index in sorted(changed):
            pending = self._pending.get(index)
            if pending is None or pending.failed is not None or not pending.intents:
                continue
            if len(pending.arrived) < self.world_size:
                continue
            if set(pending.uploaded) != set(pending.intents):
                continue
            vanished = self._vanished_files(pending)
            if vanished is not None:
                # Fails as that rank's upload would have: the caller applies the policy.
                pending.failed = ReportError(vanished.failed.error)
                self._vanished.append(vanished)
                continue
            error = self._compare_copies(pending) or self._score_missing(pending)
            if error is not None:
                # Kept as failed: its directory is among pending_dir_names() for cleanup.
                self._refused.extend(self._refuse(pending, error, first=min(pending.intents)))
                continue
            merged = self._merge(pending)
            if merged.validation is None:  # else the validation may replace the score
                self._nan_warning.note(merged, self._score_attribute)
            ready.append(merged)
            del self._pending[index]
            self._committing[index] = pending.dir_name if pending.own_upload else None
        return ready

    @staticmethod
    def _vanished_files(pending: PendingReport) -> VanishedFiles | None:
        """A rank's files listed at report() and gone when its upload read them, unless
        another rank reported the same directory and its upload, once every rank had
        reported, replaced this one (it may have renamed the file)."""
        for rank, message in sorted(pending.uploaded.items()):
            if message.vanished is not None and rank not in pending.replaced_by:
                return message.vanished
        return None

    def take_vanished(self) -> list[VanishedFiles]:
        """Uploads :meth:`take_ready` found missing files nobody replaced, to fail as
        upload failures (their reports are failed); forgets them."""
        vanished, self._vanished = self._vanished, []
        return vanished

    def on_committed(self, index: int) -> None:
        """The commit of report ``index`` finished (committed or failed)."""
        self._committing.pop(index, None)

    def abandon(self, index: int) -> None:
        """Report ``index``, taken by :meth:`take_ready`, will not be committed (the
        driver failed before handing it to the commit): it is resolved, and its directory,
        when Cairn's own uploads wrote it, is among :meth:`pending_dir_names` for cleanup."""
        dir_name = self._committing.pop(index, None)
        if dir_name is not None:
            self._abandoned.append(dir_name)

    def take_refused(self) -> list[Verdict]:
        """Refusals decided by :meth:`take_ready` (differing copies), to send; forgets them."""
        refused, self._refused = self._refused, []
        return refused

    def _score_missing(self, pending: PendingReport) -> ReportError | None:
        """A checkpoint keeps rank 0's metrics (as in Ray Train): without the score
        attribute there (rank 0 may pass no checkpoint, another rank the checkpoint and
        the score), retention could not rank it and would keep the latest instead of the
        best. A NaN score is one (the worst). Not when a validation may give the score."""
        if self._score_attribute is None or any(
                intent.validation is not None for intent in pending.intents.values()):
            return None
        rank = min(pending.arrived)
        try:
            check_score_attribute(
                pending.arrived[rank].metrics, self._score_attribute,
                what=f"report() on rank {rank} (whose metrics the checkpoint of report "
                     f"{pending.index} keeps, as in Ray Train)")
        except ReportError as exc:
            return exc
        return None

    def _compare_copies(self, pending: PendingReport) -> CheckpointCollisionError | None:
        """Whether every copy a rank did not upload equals the uploaded one."""
        for rank in sorted(pending.uploaded):
            if rank in pending.replaced_by:
                continue  # its shared directory was uploaded again, and checked, by another
            sent = pending.uploaded[rank].duplicates
            # A rank that listed its shared directory again checked what it found then.
            paths = sorted(sent) if rank in pending.relisting else pending.duplicates.get(
                rank, ())
            for path in paths:
                owner = pending.claimed.get(path)
                if owner is not None:
                    owner = pending.replaced_by.get(owner, owner)
                stored = pending.uploaded[owner].entries.get(path) if owner is not None else None
                mine = sent.get(path)
                if stored is not None and mine is not None and stored == mine:
                    continue
                if stored is None or mine is None:
                    detail = "different content"
                elif stored.size != mine.size:
                    detail = ", ".join(f"rank {r}: {n} bytes" for r, n in sorted(
                        [(owner, stored.size), (rank, mine.size)]))
                else:
                    detail = "different checksums"
                return collision_error(pending.index, path, owner if owner is not None else
                                       rank, rank, detail)
        return None

    def _merge(self, pending: PendingReport) -> ReadyCheckpoint:
        entries: dict[str, FileEntry] = {}
        references: dict[int, StorageLocation] = {}
        metadata: dict[str, object] = {}
        written: dict[str, WrittenFile] = {}
        disputed: set[str] = set()  # two ranks' writers described one file differently
        for rank in sorted(pending.uploaded):
            uploaded = pending.uploaded[rank]
            if rank not in pending.replaced_by:
                entries.update(uploaded.entries)
            for rel, record in uploaded.written.items():
                if written.setdefault(rel, record) != record:
                    disputed.add(rel)
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
        tasks = [pending.intents[r].validation for r in sorted(pending.intents)]
        validation = next((task for task in tasks if task is not None), None)
        return ReadyCheckpoint(
            index=pending.index,
            dir_name=pending.dir_name,
            metrics=rank0.metrics,
            entries=entries,
            ranks=tuple(sorted(pending.intents)),
            reference=distinct[0] if distinct else None,
            metadata=metadata,
            bytes_uploaded=sum(u.bytes_written for u in pending.uploaded.values()),
            validation=validation,
            written={rel: w for rel, w in written.items() if rel not in disputed},
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

    def unresolved_before(self, index: int) -> list[int]:
        """Report indices up to ``index`` not resolved yet: not all ranks arrived, or the
        checkpoint is not committed yet. Failed and skipped reports count as resolved."""
        waiting = {i for i, p in self._pending.items() if i <= index and p.failed is None}
        return sorted(waiting | {i for i in self._committing if i <= index})

    def missing_ranks(self, index: int) -> list[int]:
        """Ranks that have not reached report ``index`` (from their report indices)."""
        return sorted(r for r in range(self.world_size)
                      if self.last_index.get(r, self.first_index - 1) < index)

    def pending_dir_names(self) -> list[str]:
        """Directories of reports not committed that Cairn's own uploads may have written
        (:attr:`PendingReport.own_upload`), abandoned ones included."""
        return [*(p.dir_name for p in self._pending.values()
                  if p.dir_name is not None and p.own_upload), *self._abandoned]


def collision_error(index: int, path: str, first: int, second: int,
                    detail: str) -> CheckpointCollisionError:
    """Two ranks wrote ``path`` into one checkpoint with different content."""
    low, high = min(first, second), max(first, second)
    return CheckpointCollisionError(
        f"Ranks {low} and {high} both wrote {path!r} into the checkpoint of report {index} "
        f"with different content ({detail}); nothing was overwritten and the checkpoint is "
        "not committed. Identical copies are stored once; different files need distinct "
        "names (for example prefix them with the rank), or pass checkpoint=None on all but "
        "one rank."
    )
