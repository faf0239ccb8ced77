"""Settle what a dead driver left in a run directory, on the run index, before a run goes on.

Runs at start-up, before the :class:`~cairn._src.checkpoint.manager.CheckpointManager` is
built (and from it, for :meth:`~cairn._src.checkpoint.manager.CheckpointManager.reconcile`):
it lists the run directory, adopts the manifests the index does not name, deletes what
never became a checkpoint and returns the index to go on with.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection

from cairn._src.checkpoint.index import (
    CheckpointRecord,
    RunIndex,
    adopt_records,
    adoption_record,
    within_reports_made,
    write_index,
)
from cairn._src.checkpoint.manifest import read_manifest
from cairn._src.checkpoint.ownership import may_delete_partial
from cairn._src.checkpoint.recheck import committed_dir_names, recheck_uncommitted
from cairn._src.errors import CairnError
from cairn._src.run.events import read_events
from cairn._src.run.layout import EVENTS_DIR, RESERVED_NAMES
from cairn._src.storage.fileio import (
    TEMPORARY_MARK,
    delete_dir,
    delete_file,
    is_dir,
    is_local_link,
    list_dir_names,
)
from cairn._src.storage.location import StorageLocation, resolve
from cairn._src.storage.retry import RetryPolicy

logger = logging.getLogger(__name__)


def committed_in_event_log(run: StorageLocation, retry: RetryPolicy) -> set[str]:
    """The checkpoints the run's event log says committed."""
    return committed_dir_names(read_events(run.join(EVENTS_DIR), retry))


def entry_holding(run: StorageLocation, location: StorageLocation) -> str | None:
    """The run-directory entry ``location`` lies in, or None when outside the run."""
    if not run.contains(location, strictly=True):
        return None
    return location.path[len(run.path.rstrip("/")) + 1:].split("/")[0]


def reference_data(run: StorageLocation, record: CheckpointRecord) -> StorageLocation | None:
    """Where a checkpoint committed by reference keeps its data; None for one whose data
    is in its own directory. A reference recorded as ``target_path`` (a run on a
    filesystem object, which has no URI) is a path on the run's own store (``/``-rooted in
    the record; without the leading ``/`` again when the run's paths have none, as on
    object stores)."""
    if record.target_uri is not None:
        return resolve(record.target_uri)
    if record.target_path is not None:
        path = record.target_path if run.path.startswith("/") else record.target_path[1:]
        return run.with_path(path)
    return None


def names_holding_references(run: StorageLocation, index: RunIndex) -> set[str]:
    """Run-directory entries that hold data of checkpoints committed by reference (by
    URI or, on a run without one, by path)."""
    names = set()
    for record in index.checkpoints:
        data = reference_data(run, record)
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


def reconcile(run: StorageLocation, index: RunIndex, retry: RetryPolicy,
              started: Collection[str] = (), dropped: Collection[str] = (), *,
              fence: Callable[[], None] | None = None, durable: bool = True) -> RunIndex:
    """Settle what a dead driver left behind, before the run goes on; the index to go on
    with (written when it changed).

    * A manifest the index does not name (killed between manifest and index): the
      checkpoint is committed, so the index adopts it.
    * A checkpoint directory Cairn created without a manifest (killed mid-upload): never
      a checkpoint, so it is deleted. Cairn created it if it has a default name or is in
      ``started`` (explicit names, recorded before their upload began). Other
      directories (the user's logs, data of a NO_UPLOAD report still being written)
      are left alone.
    * Temporary files of interrupted atomic writes: deleted.

    ``dropped``: checkpoints an earlier resume dropped as damaged; never adopted back.
    """
    known = {r.dir_name for r in index.checkpoints}
    adopted: list[CheckpointRecord] = []
    partial: list[str] = []
    for name in list_dir_names(run, retry):
        location = run.join(name)
        if TEMPORARY_MARK in name:
            delete_file(location, retry)
            continue
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
        elif manifest.report_index is not None:
            adopted.append(adoption_record(name, manifest))
    holding_references = names_holding_references(run, index)
    for name in partial:
        if not may_delete_partial(name, has_manifest=False, indexed=known,
                                  announced=started, holding_references=holding_references):
            continue
        recheck = recheck_uncommitted(run.join(name), name, retry,
                                      lambda: committed_in_event_log(run, retry))
        if recheck.manifest is not None and recheck.manifest.report_index is not None:
            logger.warning("%s has a manifest after all (storage first answered that "
                           "it had none): adopting it", name)
            adopted.append(adoption_record(name, recheck.manifest))
        elif recheck.never_committed:
            delete_dir(run.join(name), retry)
            logger.info("Deleted %s: a directory without a manifest", name)
        else:
            logger.warning("Leaving %s in place: storage answers that it has no "
                           "manifest, but %s. Check the store; a later start deletes it "
                           "if it never committed.", name, recheck.doubt)
    adopted = within_reports_made(run, retry, index, adopted)
    if adopted:
        logger.warning("Adopting %d committed checkpoints the index did not name: %s",
                       len(adopted), [r.dir_name for r in adopted])
        index = adopt(run, index, adopted, retry, fence, durable=durable)
    return index
