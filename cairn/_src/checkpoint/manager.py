"""The checkpoint manager: commits checkpoints, keeps the index, applies retention.

Ordering is the whole point (contract item 4):

1. the data is on storage (workers uploaded it, or it was there already for a reference);
2. the metrics history up to it is flushed (a report a later start knows of: its manifest
   is never refused as beyond the reports made, ``index.within_reports_made``);
3. the manifest is written: from here on the checkpoint exists;
4. the index is written with the new checkpoint and without the ones retention drops;
5. only then are dropped checkpoints deleted.

A crash between any two steps leaves the run consistent: a directory without a manifest
is cleaned up at the next start; a manifest the index does not name yet is adopted.
Every deletion asks :mod:`ownership` first; every index write first calls ``fence`` (the
run lease's check that this driver still holds the run).
Runs on the controller's commit thread; not thread-safe otherwise.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from cairn._src.checkpoint.checkpoint import METADATA_FILE_NAME
from cairn._src.checkpoint.deletion_log import DeletionLog, EventSink
from cairn._src.checkpoint.index import CheckpointRecord, RunIndex, write_index
from cairn._src.checkpoint.manifest import MANIFEST_NAME, Manifest, read_manifest, write_manifest
from cairn._src.checkpoint.own_files import forget_checkpoint_dir
from cairn._src.checkpoint.ownership import (
    DeletionPlan,
    Target,
    could_have_created,
    may_delete_partial,
    plan_deletion,
    record_target,
    reference_event,
)
from cairn._src.checkpoint.recheck import (
    check_stored,
    commit_landed,
    manifest_asked_again,
    recheck_uncommitted,
)
from cairn._src.checkpoint.reconcile import (
    adopt,
    committed_in_event_log,
    holds,
    holds_its_reference,
    manifest_holds_its_data,
    names_holding_references,
    once,
    reconcile,
    reference_data,
)
from cairn._src.checkpoint.references import check_persisted_uri, rebind_to_run
from cairn._src.checkpoint.retention import (
    RetentionPolicy,
    make_policy,
    resume_protection,
    split_by_retention,
)
from cairn._src.checkpoint.views import CheckpointView, ReadyCheckpoint
from cairn._src.config.run import CheckpointConfig
from cairn._src.errors import (
    CairnError,
    CheckpointDamagedError,
    CheckpointNotFoundError,
    RunLeaseError,
)
from cairn._src.run.events import CheckpointDropped
from cairn._src.run.segment_log import SegmentLog
from cairn._src.storage.fileio import (
    delete_dir,
    delete_file,
    is_local_link,
    list_dir_names,
    list_files,
)
from cairn._src.storage.location import StorageLocation
from cairn._src.storage.retry import RetryPolicy
from cairn._src.storage.transfer import check_directory_sizes, verify_committed
from cairn._src.storage.tuning import TransferConfig
from cairn._src.storage.written import entries_of

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CommitOutcome:
    view: CheckpointView
    # No longer in the index; for delete_dropped() once the workers have been told.
    dropped: tuple[CheckpointRecord, ...]
    seconds: float


def is_safe_record_name(name: str) -> bool:
    """Whether an index record's ``dir_name`` can name a direct child of the run."""
    return could_have_created(name)


def checkpoint_view(run: StorageLocation, record: CheckpointRecord) -> CheckpointView:
    """Where a committed checkpoint's data (:func:`reference_data`) and manifest are."""
    manifest_at = run.join(record.dir_name)
    data = reference_data(run, record)
    return CheckpointView(
        dir_name=record.dir_name,
        report_index=record.report_index,
        data=manifest_at if data is None else data,
        manifest_at=manifest_at,
        metrics=record.metrics,
    )


class CheckpointManager:
    def __init__(
        self,
        run: StorageLocation,
        config: CheckpointConfig,
        retry: RetryPolicy,
        index: RunIndex,
        history: SegmentLog,
        *,
        fence: Callable[[], None] | None = None,
        events: EventSink | None = None,
        registered: Mapping[str, Target] | None = None,
        policy: RetentionPolicy | None = None,
        transfer: TransferConfig | None = None,
        fsync: bool = True,
    ) -> None:
        self.run = run
        self.config = config
        self.retry = retry
        self.index = index
        self.history = history
        # Called before every index write; raises RunLeaseError once the lease is lost.
        self.fence = fence
        # Where the run's events are emitted (the event log among its observers), for the
        # records a later driver needs (registered references, checkpoints dropped as
        # damaged).
        self.events = events
        # dir_name -> the reference this run registered under it (from its event log and
        # its own commits): only those may ever be deleted (see ownership.py).
        self.registered: dict[str, Target] = dict(registered or {})
        # What retention keeps (CheckpointConfig's, unless the run wraps it: validations
        # pending keep theirs).
        self.policy = policy or make_policy(
            config.num_to_keep, config.checkpoint_score_attribute, config.checkpoint_score_order
        )
        # The run's transfer settings (RunConfig.storage_transfer), for the full checks.
        self.transfer = transfer
        # RunConfig.storage_fsync: manifests and the index are written durably (data files
        # are fsynced by the workers that wrote them, before they announce them).
        self.fsync = fsync
        # Commits that failed once their manifest write was attempted (the manifest, the
        # event log flush, or the index write): the store may have kept what
        # it did not acknowledge. Settled by settle_uncertain() before the next attempt.
        self._uncertain: list[CheckpointRecord] = []
        # Checkpoint directories whose deletion failed, or waits for its record in the
        # event log to be durable: retried later (retry_deletions()).
        self.failed_deletions: dict[str, CheckpointRecord | None] = {}
        self._deletion_log = DeletionLog(events)
        # Deletions the ownership check approved and that have not finished yet.
        self._approved: dict[str, DeletionPlan] = {}
        # For choose_resume(): checkpoints this driver committed (uploads into the run
        # directory), those a worker found damaged while restoring (verified in full next
        # time), and those verified in full by this process.
        self.committed_here: set[str] = set()
        self.suspects: set[str] = set()
        self.fully_verified: set[str] = set()
        # (dir_name, registered reference) -> whether it lies in <run>/<dir_name>.
        self._holding: dict[tuple[str, Target], bool] = {}

    # --- views of committed checkpoints ----------------------------------------------------

    def view(self, record: CheckpointRecord) -> CheckpointView:
        return checkpoint_view(self.run, record)

    def latest_view(self) -> CheckpointView | None:
        latest = self.index.latest
        return self.view(latest) if latest is not None else None

    # --- commit ------------------------------------------------------------------------------

    def _write_index(self, index: RunIndex) -> None:
        if self.fence is not None:
            self.fence()
        write_index(self.run, index, self.retry, durable=self.fsync)

    def commit(self, ready: ReadyCheckpoint, *, attempt: int) -> CommitOutcome:
        """Commit ``ready``; :class:`RunLeaseError` before anything is written when this
        driver no longer holds the run."""
        started = time.perf_counter()
        if self.fence is not None:
            self.fence()
        manifest_at = self.run.join(ready.dir_name)
        entries = ready.entries
        target_uri: str | None = None
        target_path: str | None = None
        managed = True
        data = manifest_at
        if ready.reference is not None and ready.reference != manifest_at:
            data = ready.reference
            if data.uri is None:
                # No URI: a path on the run's own storage filesystem (report() refuses any
                # other), recorded as a path and read through this driver's store object.
                data = rebind_to_run(data, self.run, what=f"The checkpoint of report "
                                     f"{ready.index}")
                target_path = "/" + data.path.lstrip("/")
            else:
                check_persisted_uri(data.uri, what=f"The checkpoint of report {ready.index}")
                target_uri = data.uri
            # A reference is checksummed here, on the commit thread (or by the writer that
            # wrote it), so that restoring it later is verified like any managed checkpoint.
            names = [n for n in list_files(data, self.retry) if n != METADATA_FILE_NAME]
            entries = entries_of(data, names, ready.written, retry=self.retry)
            managed = self.run.contains(data, strictly=True)
        elif ready.reference is not None:
            names = [n for n in list_files(data, self.retry)
                     if n not in (METADATA_FILE_NAME, MANIFEST_NAME)]
            entries = entries_of(data, names, ready.written, retry=self.retry)
        manifest = Manifest(
            files=entries,
            metadata=dict(ready.metadata),
            report_index=ready.index,
            metrics=dict(ready.metrics),
            ranks=ready.ranks,
            target_uri=target_uri,
            target_path=target_path,
        )
        if ready.reference is None:
            # Uploaded by the workers: the store must hold it all before it commits.
            check_stored(manifest_at, entries, self.retry)
        record = CheckpointRecord(
            dir_name=ready.dir_name,
            report_index=ready.index,
            metrics=dict(ready.metrics),
            target_uri=target_uri,
            target_path=target_path,
            managed=managed,
            attempt=attempt,
            committed_at=time.time(),
            size_bytes=sum(entry.size for entry in entries.values()),
        )
        # Before the manifest: a driver killed right after it leaves a history that knows
        # of this report, so the next start adopts the checkpoint instead of refusing it
        # (and reusing its name). A history record without a commit is normal.
        self.history.flush()
        try:
            index, dropped = self._write_committed(manifest_at, manifest, record)
        except RunLeaseError:
            raise
        except BaseException:
            # The manifest may have landed (its write, or its directory's fsync, may have
            # failed after the rename) and so may the index (a lost answer): the checkpoint
            # may be committed. The next attempt settles it before choosing where to resume
            # (settle_uncertain()): adopted if its manifest is there, else forgotten.
            self._uncertain.append(record)
            raise
        self.index = index
        if ready.reference is None:
            # Uploaded by Cairn into the run directory and committed by this driver: a
            # resume right after a worker crash does not re-read it (verify_on_resume).
            self.committed_here.add(ready.dir_name)
        seconds = time.perf_counter() - started
        logger.info("Committed %s (report %d) in %.3fs; retention drops %s", ready.dir_name,
                    ready.index, seconds, [r.dir_name for r in dropped] or "nothing")
        return CommitOutcome(self.view(record), dropped, seconds)

    def _write_committed(self, manifest_at: StorageLocation, manifest: Manifest,
                         record: CheckpointRecord,
                         ) -> tuple[RunIndex, tuple[CheckpointRecord, ...]]:
        """The commit's writes, from the manifest on; the index written and the records
        retention dropped. Any error here leaves the commit uncertain (see ``commit``)."""
        write_manifest(manifest_at, manifest, self.retry, durable=self.fsync)
        target = record_target(record)
        if target is not None:
            # Registered before the index names it: only a reference this run registered
            # may ever be deleted (delete_unmanaged_checkpoints=True).
            self.registered[record.dir_name] = target
            if self.events is not None:
                self.events.emit(reference_event(record, t=time.time()))
                self.events.flush()
        records = [*self.index.checkpoints, record]
        kept, dropped = split_by_retention(self.policy, records,
                                           protected=[resume_protection(records, self.index)])
        index = self.index.with_changes(
            checkpoints=kept,
            next_report_index=max(self.index.next_report_index, record.report_index + 1),
        )
        self._write_index(index)
        return index, dropped

    def delete_dropped(self, records: tuple[CheckpointRecord, ...]) -> None:
        """Delete checkpoints the index no longer names (after ``commit`` returned them).

        Separate from ``commit`` so that a SYNC report returns as soon as its checkpoint is
        committed, without waiting for older checkpoints to be deleted. Storage errors are
        logged, not raised: a deletion that fails, or whose record in the event log could
        not be made durable, is retried later (:meth:`retry_deletions`).
        """
        # Logged durably before any deletion starts: a later driver that finds one of
        # these half deleted knows it was deleted on purpose (checkpoint/recheck.py).
        if not self._deletion_log.announce(records, reason="retention"):
            for record in records:
                self.failed_deletions[record.dir_name] = record
            return
        for record in records:
            self._delete(record)

    def _delete(self, record: CheckpointRecord) -> None:
        """Delete what :func:`plan_deletion` allows of a checkpoint the index dropped."""
        try:
            self.delete_owned(record, delete_references=self.config.delete_unmanaged_checkpoints)
        except Exception as exc:
            # The index no longer names it: a leftover costs space, never correctness.
            # Retried later in the run and at its end (retry_deletions()).
            self.failed_deletions[record.dir_name] = record
            logger.warning("Could not delete dropped checkpoint %s (retried later): %s",
                           record.dir_name, exc)
        else:
            self.failed_deletions.pop(record.dir_name, None)

    def delete_owned(self, record: CheckpointRecord, *, delete_references: bool) -> bool:
        """Delete the checkpoint ``record`` names, as far as this run owns it.

        Returns whether its directory was deleted (for a reference whose data lies inside
        it: Cairn's files there). Storage errors propagate; what the run does not own is
        left in place with a warning.
        """
        if not is_safe_record_name(record.dir_name):
            logger.warning("Not deleting %r: not a checkpoint directory of this run",
                           record.dir_name)
            return False
        manifest_dir = self.run.join(record.dir_name)
        if is_local_link(manifest_dir):
            logger.warning("Not deleting %s: it is a symbolic link, not a directory this run "
                           "wrote; what it points at is left in place", record.dir_name)
            return False
        # A deletion retried after a storage error: the manifest it checked may be gone.
        plan = self._approved.get(record.dir_name)
        if plan is None:
            try:
                manifest = read_manifest(manifest_dir, self.retry)
            except CheckpointDamagedError as exc:
                logger.warning("Not deleting %s: %s", record.dir_name, exc)
                return False
            plan = plan_deletion(record, manifest=manifest, registered=self.registered,
                                 delete_references=delete_references)
            for refusal in plan.refusals:
                logger.warning("Leaving data of %s in place: %s", record.dir_name, refusal)
            if not plan.checkpoint_dir:
                return False
            if manifest is not None and manifest_holds_its_data(self.run, manifest_dir,
                                                                manifest):
                plan = dataclasses.replace(plan, keep_contents=True)
            self._approved[record.dir_name] = plan
        try:
            data = reference_data(self.run, record)
            inside = plan.keep_contents or (data is not None and holds(manifest_dir, data))
        except CairnError as exc:
            # Where its data is cannot be told: only Cairn's own files go (below).
            logger.warning("Leaving data of %s in place: %s", record.dir_name, exc)
            data, inside = None, True
        # The manifest goes first, durably: a crash half-way (of the machine too) leaves a
        # directory without one, which is never taken for a checkpoint again.
        delete_file(manifest_dir.join(MANIFEST_NAME), self.retry, durable=self.fsync)
        if plan.reference and data is not None:
            if self._shared_with_kept(data):
                logger.info("Keeping the data of %s: a kept checkpoint uses it too",
                            record.dir_name)
            else:
                delete_dir(data, self.retry)
        if inside:
            # A reference inside its own checkpoint directory (a checkpoint_upload_fn that
            # wrote into build_checkpoint_path_from_name(name)/dcp): the user's data and
            # anything else there stays; only Cairn's own files go.
            forget_checkpoint_dir(manifest_dir, self.retry)
        else:
            delete_dir(manifest_dir, self.retry)
        self._approved.pop(record.dir_name, None)
        return True

    def retry_deletions(self) -> list[str]:
        """Try again the deletions that failed; the names that still fail. Those whose
        record in the event log is not durable yet wait for a flush that succeeds."""
        self._deletion_log.flush()
        for name, record in list(self.failed_deletions.items()):
            if record is not None and self.index.find(name) is None:
                if self._deletion_log.may_delete(name):
                    self._delete(record)
            elif record is None:
                self.delete_uncommitted([name])
            else:
                self.failed_deletions.pop(name, None)
        return sorted(self.failed_deletions)

    def _shared_with_kept(self, target: StorageLocation) -> bool:
        """Whether a checkpoint still in the index has its data at, in or above ``target``."""
        for record in self.index.checkpoints:
            data = self.view(record).data
            if (data == target or target.contains(data, strictly=True)
                    or data.contains(target, strictly=True)):
                return True
        return False

    def save_index(self, **changes: object) -> None:
        self.index = self.index.with_changes(**changes)
        self._write_index(self.index)

    def apply_validation(self, dir_name: str,
                         metrics: dict[str, object]) -> tuple[CheckpointRecord, ...]:
        """Merge a validation's ``metrics`` into a committed checkpoint and re-rank.

        The manifest is rewritten first (atomically, so the checkpoint stays committed and a
        rebuilt index has the metrics too), then the index, with retention applied to the
        new scores. Returns the records retention dropped, for :meth:`delete_dropped`. A
        checkpoint no longer in the index is left alone. Call on the commit thread.
        """
        record = self.index.find(dir_name)
        if record is None:
            return ()
        merged = {**record.metrics, **metrics}
        manifest_at = self.run.join(dir_name)
        manifest = read_manifest(manifest_at, self.retry)
        if manifest is not None and metrics:
            write_manifest(manifest_at, dataclasses.replace(manifest, metrics=merged),
                           self.retry, durable=self.fsync)
        updated = dataclasses.replace(record, metrics=merged)
        records = [updated if r is record else r for r in self.index.checkpoints]
        kept, dropped = split_by_retention(self.policy, records,
                                           protected=[resume_protection(records, self.index)])
        index = self.index.with_changes(checkpoints=kept)
        self._write_index(index)
        self.index = index
        logger.info("Validation metrics of %s merged; retention drops %s", dir_name,
                    [r.dir_name for r in dropped] or "nothing")
        return dropped

    # --- start-up and recovery ---------------------------------------------------------------

    def _committed_in_event_log(self) -> set[str]:
        return committed_in_event_log(self.run, self.retry)

    def _confirmed_uncommitted(self, name: str) -> bool:
        """Whether storage, asked again, and the event log agree that ``name`` never
        committed (see :mod:`.recheck`); a doubt is logged and keeps it in place."""
        recheck = recheck_uncommitted(self.run.join(name), name, self.retry,
                                      self._committed_in_event_log)
        if recheck.manifest is not None:
            logger.warning("Not deleting %s: storage first answered that it has no "
                           "manifest, then showed it (report %s)", name,
                           recheck.manifest.report_index)
        elif recheck.doubt is not None:
            logger.warning("Leaving %s in place: storage answers that it has no manifest, "
                           "but %s. Check the store; a later start deletes it if it "
                           "never committed.", name, recheck.doubt)
        return recheck.never_committed

    def delete_uncommitted(self, dir_names: list[str]) -> None:
        """Delete directories of this run's reports that never committed (a failed
        attempt's, a skipped upload's); one that fails is retried later. Nothing is
        deleted on one answer of storage: see :meth:`_confirmed_uncommitted`."""
        indexed = {r.dir_name for r in self.index.checkpoints}
        holding = self.names_holding_references()
        for name in dir_names:
            if name in indexed or name in holding:
                continue
            location = self.run.join(name)
            try:
                has_manifest = read_manifest(location, self.retry) is not None
                if may_delete_partial(name, has_manifest=has_manifest, indexed=indexed,
                                      announced=dir_names, holding_references=holding):
                    if self._confirmed_uncommitted(name):
                        delete_dir(location, self.retry)
                        logger.info("Deleted uncommitted checkpoint directory %s", name)
                self.failed_deletions.pop(name, None)
            except CheckpointDamagedError as exc:
                logger.warning("Leaving %s in place: %s", name, exc)
            except CairnError as exc:
                self.failed_deletions[name] = None
                logger.warning("Could not delete uncommitted %s yet (retried later): %s",
                               name, exc)

    def reconcile(self, started: Collection[str] = (), dropped: Collection[str] = ()) -> None:
        """Settle what a dead driver left behind (:func:`.reconcile.reconcile`)."""
        self.index = reconcile(self.run, self.index, self.retry, started, dropped,
                               fence=self.fence, durable=self.fsync)

    def names_holding_references(self) -> set[str]:
        """Run-directory entries that hold data of checkpoints committed by reference: of
        those in the index, and of those forgotten whose data lies in their own directory
        (:func:`.reconcile.holds_its_reference`)."""
        names = names_holding_references(self.run, self.index)
        for name, target in self.registered.items():
            if (name, target) not in self._holding:
                self._holding[(name, target)] = holds_its_reference(self.run, name,
                                                                     {name: target})
            if self._holding[(name, target)]:
                names.add(name)
        return names

    def settle_uncertain(self) -> set[str]:
        """Settle commits whose index write failed after their manifest landed; the names
        of those adopted.

        The store may have written the index and lost its answer: the checkpoint is
        committed (its manifest says so), so the index names it again and the next attempt
        may resume from it. Call before :meth:`choose_resume`.
        """
        # Asked again where storage answers "not found" (commit_landed); kept uncertain,
        # all of them, until every one is settled and the adoption written.
        committed = once(self._committed_in_event_log)
        adopted = [r for r in self._uncertain if self.index.find(r.dir_name) is None
                   and commit_landed(self.run.join(r.dir_name), r.dir_name, r.report_index,
                                     self.retry, committed)]
        if adopted:
            logger.warning("Adopting %s: committed, but the index write of the commit failed",
                           [r.dir_name for r in adopted])
            self.index = adopt(self.run, self.index, adopted, self.retry, self.fence,
                               durable=self.fsync)
        self._uncertain = []
        return {r.dir_name for r in adopted}

    def choose_resume(self) -> CheckpointView | None:
        """The latest committed checkpoint that passes its check; damaged ones are skipped.

        The check (``CheckpointConfig.verify_on_resume``): ``"sizes"`` reads the manifest
        and checks that every file is a regular file of the recorded size, reading no data
        (the workers verify checksums as they restore); ``"full"``, and any checkpoint in
        :attr:`suspects` (a worker found it damaged), reads and checksums every byte. A
        checkpoint this driver committed itself (:attr:`committed_here`) and no worker
        found damaged is not re-read at all. A checkpoint with any kind of damage
        (:class:`CheckpointDamagedError`) is dropped from the index with a warning,
        recorded as dropped in the event log (so reconcile never adopts it back) and the
        previous one is tried. All drops are written in one index write. A storage outage
        is no damage: it propagates.
        """
        records = sorted(self.index.checkpoints, key=lambda r: r.report_index, reverse=True)
        # Read at most once per resume, and only if a manifest reads as missing.
        committed = once(self._committed_in_event_log)
        listed = once(lambda: set(list_dir_names(self.run, self.retry)))
        dropped: list[CheckpointRecord] = []
        chosen: CheckpointView | None = None
        for record in records:
            name = record.dir_name
            try:
                view = self.view(record)
            except CairnError as exc:
                # Where its data lies cannot be told here (a URI whose scheme this process
                # has not registered): not resumed from, and kept in the index.
                logger.warning("Not resuming from %s (report %d): %s", name,
                               record.report_index, exc)
                continue
            if name in self.committed_here and name not in self.suspects:
                chosen = view
                break
            try:
                manifest = read_manifest(view.manifest_at, self.retry)
                if manifest is None:
                    manifest = manifest_asked_again(view.manifest_at, name, self.retry,
                                                    committed, listed)
                if self.config.verify_on_resume == "full" or name in self.suspects:
                    verify_committed(view.data, manifest.files, retry=self.retry,
                                     transfer=self.transfer)
                    self.fully_verified.add(name)
                    self.suspects.discard(name)
                else:
                    check_directory_sizes(view.data, manifest.files, retry=self.retry)
            except (CheckpointDamagedError, CheckpointNotFoundError) as exc:
                # Only damage drops a checkpoint; a storage outage fails the attempt instead
                # (it counts as a failure and the next attempt tries again).
                if len(dropped) < 20:
                    logger.warning(
                        "Not resuming from %s (report %d): %s. Falling back to the previous "
                        "committed checkpoint.", record.dir_name, record.report_index,
                        str(exc).rstrip("."),
                    )
                dropped.append(record)
                if self.events is not None:
                    self.events.emit(CheckpointDropped(
                        t=time.time(), dir_name=record.dir_name,
                        report_index=record.report_index, reason=str(exc)[:500]))
                continue
            chosen = view
            break
        if dropped:
            if len(dropped) > 20:
                logger.warning("Dropped %d damaged checkpoints in all", len(dropped))
            if self.events is not None:
                # Before the index forgets them: a driver killed in between adopts them
                # back and drops them again, never the other way round.
                self.events.flush()
            names = {r.dir_name for r in dropped}
            self.save_index(checkpoints=tuple(r for r in self.index.checkpoints
                                              if r.dir_name not in names))
        return chosen
