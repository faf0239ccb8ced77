"""Settle what a dead driver left in a run directory, on the run index, before a run goes on.

Runs at start-up, before the :class:`~cairn._src.checkpoint.manager.CheckpointManager` is
built (and from it, for :meth:`~cairn._src.checkpoint.manager.CheckpointManager.reconcile`):
it lists the run directory, adopts the manifests of this run the index does not name
(never a user's copy of a checkpoint), deletes what never became a checkpoint and returns
the index to go on with.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from typing import TypeVar

from cairn._src.checkpoint.index import (
    CheckpointRecord,
    RunIndex,
    adopt_records,
    adoption_record,
    reports_made,
    within_reports_made,
    without_copies,
    write_index,
)
from cairn._src.checkpoint.manifest import Manifest, read_manifest
from cairn._src.checkpoint.own_files import (
    RUN_FILES,
    delete_torn_writes,
    is_log_entry,
    warn_left,
)
from cairn._src.checkpoint.ownership import (
    Target,
    beyond_reports_made,
    default_name_report,
    manifest_target,
    may_delete_partial,
    record_target,
    registered_references,
)
from cairn._src.checkpoint.recheck import committed_dir_names, recheck_uncommitted
from cairn._src.errors import CairnError
from cairn._src.run.events import Event, read_events
from cairn._src.run.layout import EVENTS_DIR, METRICS_DIR, RESERVED_NAMES
from cairn._src.storage.fileio import (
    TEMPORARY_MARK,
    delete_dir,
    is_dir,
    is_local_link,
    list_dir_names,
)
from cairn._src.storage.location import StorageLocation, resolve
from cairn._src.storage.retry import RetryPolicy
from cairn._src.text import plural

logger = logging.getLogger(__name__)

T = TypeVar("T")


def once(compute: Callable[[], T]) -> Callable[[], T]:
    """``compute``, called at most once: later calls return its first result."""
    results: list[T] = []

    def cached() -> T:
        if not results:
            results.append(compute())
        return results[0]

    return cached


def committed_in_event_log(run: StorageLocation, retry: RetryPolicy) -> set[str]:
    """The checkpoints the run's event log says committed."""
    return committed_dir_names(read_events(run.join(EVENTS_DIR), retry))


def entry_holding(run: StorageLocation, location: StorageLocation) -> str | None:
    """The run-directory entry ``location`` lies in, or None when outside the run."""
    if not run.contains(location, strictly=True):
        return None
    return location.path[len(run.path.rstrip("/")) + 1:].split("/")[0]


def target_location(run: StorageLocation, target: Target) -> StorageLocation:
    """Where a reference keeps its data. One recorded as a path (a run on a filesystem
    object, which has no URI) is a path on the run's own store (``/``-rooted in the
    record; without the leading ``/`` again when the run's paths have none, as on object
    stores)."""
    kind, value = target
    if kind == "uri":
        return resolve(value)
    return run.with_path(value if run.path.startswith("/") else value[1:])


def reference_data(run: StorageLocation, record: CheckpointRecord) -> StorageLocation | None:
    """Where a checkpoint committed by reference keeps its data (:func:`target_location`);
    None for one whose data is in its own directory."""
    target = record_target(record)
    return None if target is None else target_location(run, target)


def holds(directory: StorageLocation, data: StorageLocation) -> bool:
    """Whether ``data`` is ``directory`` or lies inside it, resolved (``contains``) or as
    written (a link inside it is inside it too)."""
    if directory.contains(data):
        return True
    mine, theirs = directory.path.strip("/"), data.path.strip("/")
    return directory.same_store(data) and (theirs == mine or theirs.startswith(mine + "/"))


def holds_its_reference(run: StorageLocation, name: str,
                        registered: Mapping[str, Target]) -> bool:
    """Whether ``<run>/<name>`` holds the data of the reference this run registered under
    ``name`` (a ``checkpoint_upload_fn`` that wrote into the named directory and returned
    a directory inside it): the user's data, which a directory left without its manifest
    keeps after retention forgot the checkpoint, so never Cairn's to delete as a partial."""
    target = registered.get(name)
    if target is None:
        return False
    try:
        return holds(run.join(name), target_location(run, target))
    except CairnError:
        return False  # a URI no store resolves: not inside the run


def manifest_holds_its_data(run: StorageLocation, directory: StorageLocation,
                            manifest: Manifest) -> bool:
    """Whether ``manifest`` (the one in ``directory``) names a reference whose data lies
    in ``directory``; a reference whose place cannot be told counts as inside. The
    manifest decides, not the index record: an index edited to call such a checkpoint
    managed must not make the user's data deletable with its directory."""
    target = manifest_target(manifest)
    if target is None:
        return False
    try:
        return holds(directory, target_location(run, target))
    except CairnError:
        return True


def names_holding_references(run: StorageLocation, index: RunIndex) -> set[str]:
    """Run-directory entries that hold data of checkpoints committed by reference (by
    URI or, on a run without one, by path)."""
    names = set()
    for record in index.checkpoints:
        try:
            data = reference_data(run, record)
        except CairnError as exc:
            # A URI no store resolves (an unregistered scheme, say): not inside the run.
            # Storage is untrusted: one such record must not stop every start.
            logger.warning("Cannot tell where the data of %s lies (%s); taking it for "
                           "outside the run directory", record.dir_name, exc)
            continue
        name = entry_holding(run, data) if data is not None else None
        if name is not None:
            names.add(name)
    return names


def adopt(run: StorageLocation, index: RunIndex, adopted: list[CheckpointRecord],
          retry: RetryPolicy, fence: Callable[[], None] | None = None, *,
          durable: bool = True) -> RunIndex:
    """Write the index with ``adopted`` (committed checkpoints it did not name) added, in
    report order, and the next report index past them; the index written (fsynced with
    ``durable``, the run's ``storage_fsync``)."""
    index = adopt_records(index, adopted)
    if fence is not None:
        fence()
    write_index(run, index, retry, durable=durable)
    return index


def delete_torn_log_writes(run: StorageLocation, retry: RetryPolicy) -> None:
    """Delete the temporary files a driver killed while it flushed the event log or the
    metrics history left beside their segments (``segment_NNNNNN.jsonl.cairn-tmp-<32 hex
    digits>``, regular files); other entries there named with the mark stay, with one
    warning a directory. Log segments never pass for these (``segment_log.py`` counts only
    exact segment names)."""
    for log in (EVENTS_DIR, METRICS_DIR):
        directory = run.join(log)
        if is_local_link(directory):
            continue  # not a directory this run wrote: nothing in it is Cairn's to delete
        marked = [name for name in list_dir_names(directory, retry) if TEMPORARY_MARK in name]
        warn_left(directory, delete_torn_writes(directory, marked, is_log_entry, retry),
                  "segment_NNNNNN.jsonl")


def reconcile(run: StorageLocation, index: RunIndex, retry: RetryPolicy,
              started: Collection[str] = (), dropped: Collection[str] = (),
              deleting: Collection[str] = (), *,
              fence: Callable[[], None] | None = None, durable: bool = True) -> RunIndex:
    """Settle what a dead driver left behind, before the run goes on; the index to go on
    with (written when it changed).

    * A manifest the index does not name (killed between manifest and index): the
      checkpoint is committed, so the index adopts it, where this run can have written
      it: under its report's default name or a name in ``started`` (explicit names,
      recorded before their upload began) or registered by reference, for a report the
      index does not name, at most one past the reports the run made
      (:func:`~.index.within_reports_made`). Any other manifest is a copy or not this
      run's (:func:`without_copies`): left in place, neither adopted nor deleted, with a
      warning.
    * A checkpoint directory Cairn created without a manifest (killed mid-upload): never
      a checkpoint, so it is deleted. Cairn created it if it has a default name of a
      report at most one past the reports the run made, or is in ``started``. Other
      directories (the user's logs, data of a NO_UPLOAD report still being written, a
      default name beyond the reports made: with a warning) are left alone.
    * Temporary files of interrupted atomic writes: deleted when they are exactly that,
      a regular file named ``<a file Cairn writes here>.cairn-tmp-<32 hex digits>``, in the
      run directory and beside the log segments (:func:`delete_torn_log_writes`); other
      entries named with the mark (a directory, a link, a user's file) are left in place
      with one warning.
    * A directory without a manifest that holds the data of the reference this run
      registered under its name (:func:`holds_its_reference`; retention forgot that
      checkpoint and left its data) is the user's: left alone.

    ``dropped``: checkpoints an earlier resume dropped as damaged; never adopted back.
    ``deleting``: checkpoints whose deletion retention or ``cairn prune`` logged; never
    adopted back either (their deletion is finished by the manager, see
    :mod:`.opening`), and deleted here once their manifest is gone.
    """
    known = {r.dir_name for r in index.checkpoints}
    adopted: list[CheckpointRecord] = []
    partial: list[str] = []
    names = list_dir_names(run, retry)
    marked = [name for name in names if TEMPORARY_MARK in name]
    warn_left(run, delete_torn_writes(run, marked, RUN_FILES, retry))
    delete_torn_log_writes(run, retry)
    for name in names:
        location = run.join(name)
        if TEMPORARY_MARK in name:
            continue  # never a checkpoint's name (layout.py)
        if (name in RESERVED_NAMES or name in known or name in dropped
                or is_local_link(location) or not is_dir(location, retry)):
            continue  # a link is not the run's: never adopted, never deleted
        try:
            manifest = read_manifest(location, retry)
        except CairnError as exc:
            logger.warning("Ignoring %s: %s", name, exc)
            continue
        if manifest is None:
            partial.append(name)
        elif manifest.report_index is not None and name not in deleting:
            adopted.append(adoption_record(name, manifest))
    holding_references = names_holding_references(run, index)
    events: Callable[[], list[Event]] = once(lambda: read_events(run.join(EVENTS_DIR), retry))
    registered = once(lambda: registered_references(events()))
    made = once(lambda: reports_made(run, retry, index, events()))
    for name in partial:
        if not may_delete_partial(name, has_manifest=False, indexed=known,
                                  announced=started, holding_references=holding_references):
            continue
        if holds_its_reference(run, name, registered()):
            logger.debug("Leaving %s in place: it holds the data of a checkpoint this run "
                         "registered by reference", name)
            continue
        number = default_name_report(name)
        # Up to the index's next report a name is never beyond: the logs are read only past it.
        if (number is not None and number > index.next_report_index
                and beyond_reports_made(name, made())):
            logger.warning(
                "Leaving %s in place: it has no manifest and the name of the checkpoint of "
                "report %d, but this run has made %s, so it did not create it. Remove it "
                "yourself if it is not needed.", name, number, plural(made(), "report"))
            continue
        try:
            recheck = recheck_uncommitted(run.join(name), name, retry,
                                          lambda: committed_dir_names(events()))
            if recheck.never_committed:
                delete_dir(run.join(name), retry)
                logger.info("Deleted %s: a directory without a manifest", name)
        except CairnError as exc:
            # As its manifest read above: one entry storage cannot answer for (or delete)
            # must not stop every start; a later start tries again.
            logger.warning("Leaving %s in place: %s", name, exc)
            continue
        if (recheck.manifest is not None and recheck.manifest.report_index is not None
                and name not in deleting):
            logger.warning("%s has a manifest after all (storage first answered that "
                           "it had none): adopting it", name)
            adopted.append(adoption_record(name, recheck.manifest))
        elif not recheck.never_committed:
            logger.warning("Leaving %s in place: storage answers that it has no "
                           "manifest, but %s. Check the store; a later start deletes it "
                           "if it never committed.", name, recheck.doubt)
    adopted = within_reports_made(run, retry, index, adopted)
    if adopted:
        # A NO_UPLOAD report announces no directory before its commit; its registered
        # reference names it (flushed after the manifest, before the index).
        adopted = without_copies(
            adopted, {*started, *registered()}, skipping="Not adopting {}",
            indexed={r.report_index: r.dir_name for r in index.checkpoints})
    if adopted:
        logger.warning("Adopting %d committed checkpoints the index did not name: %s",
                       len(adopted), [r.dir_name for r in adopted])
        index = adopt(run, index, adopted, retry, fence, durable=durable)
    return index
