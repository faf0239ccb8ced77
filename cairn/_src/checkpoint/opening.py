"""Open a run directory at start-up: its index (read, else rebuilt), the references it
registered, and what a dead driver left behind settled (:mod:`.reconcile`).

Runs on the driver's calling thread before the checkpoint manager is built with what it
returns.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from cairn._src.checkpoint.index import (
    CheckpointRecord,
    Retention,
    RunIndex,
    adoption_record,
    read_or_rebuild_index,
)
from cairn._src.checkpoint.manifest import read_manifest
from cairn._src.checkpoint.ownership import Target, registered_references
from cairn._src.checkpoint.reconcile import once, reconcile
from cairn._src.config.run import CheckpointConfig
from cairn._src.errors import CairnError
from cairn._src.run.events import (
    CheckpointDeleting,
    CheckpointDropped,
    CheckpointStarted,
    read_events,
)
from cairn._src.run.layout import EVENTS_DIR
from cairn._src.storage.fileio import list_dir_names
from cairn._src.storage.location import StorageLocation
from cairn._src.storage.retry import RetryPolicy
from cairn._src.text import plural

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class OpenedRun:
    """A run directory as a new driver found and settled it."""

    index: RunIndex
    # dir_name -> the reference the run registered under it (see ownership.py).
    registered: dict[str, Target]
    # Checkpoints whose deletion retention or `cairn prune` logged and did not finish
    # (their manifests still read): the manager deletes them as retention would.
    unfinished_deletions: tuple[CheckpointRecord, ...] = ()


def open_run(run: StorageLocation, config: CheckpointConfig, retry: RetryPolicy, *,
             durable: bool = True) -> OpenedRun:
    """Read the run's index (rebuilt from the manifests when damaged or lost while the run
    committed checkpoints), with ``config``'s retention settings, and reconcile it (an
    index written then is fsynced with ``durable``, the run's ``storage_fsync``)."""
    logged = once(lambda: read_events(run.join(EVENTS_DIR), retry))
    index, rebuilt = read_or_rebuild_index(run, retry, logged)
    if rebuilt:  # attempts and failures are counted from the event log
        logger.warning("%s; rebuilding the run index from the checkpoint manifests", rebuilt)
    if index is not None:
        logger.info("Continuing run %s: %s committed, %s so far", run.display(),
                    plural(len(index.checkpoints), "checkpoint"),
                    plural(index.attempts, "attempt"))
    # The retention settings go into the index: Result.from_path orders the best
    # checkpoints by them, and `cairn show` says why each one is kept.
    retention = Retention(config.num_to_keep, config.checkpoint_score_attribute,
                          config.checkpoint_score_order)
    current = (RunIndex(retention=retention) if index is None
               else index.with_changes(retention=retention))
    events = logged()
    # What this run recorded decides what it may delete (ownership.py), never the
    # index alone.
    registered = registered_references(events)
    if index is not None:
        started = {str(e.dir_name) for e in events
                   if isinstance(e, CheckpointStarted) and e.dir_name is not None}
        # Dropped as damaged by an earlier resume: never adopted back.
        dropped = {str(e.dir_name) for e in events
                   if isinstance(e, CheckpointDropped) and e.dir_name is not None}
        deleting = {str(e.dir_name): e.report_index for e in events
                    if isinstance(e, CheckpointDeleting) and e.dir_name is not None}
        current = reconcile(run, current, retry, started, dropped, set(deleting),
                            durable=durable)
        return OpenedRun(current, registered, _unfinished(run, current, deleting, retry))
    return OpenedRun(current, registered)


def _unfinished(run: StorageLocation, index: RunIndex, deleting: dict[str, int | None],
                retry: RetryPolicy) -> tuple[CheckpointRecord, ...]:
    """The checkpoints in ``deleting`` (name: the report whose deletion was logged) that
    the index does not name and whose manifest, of that report, still reads."""
    names = set(list_dir_names(run, retry)) if deleting else set()
    unfinished = []
    for name, report_index in sorted(deleting.items()):
        if name not in names or index.find(name) is not None:
            continue
        try:
            manifest = read_manifest(run.join(name), retry)
        except CairnError as exc:
            logger.warning("Not finishing the deletion of %s: %s", name, exc)
            continue
        if manifest is not None and manifest.report_index in (report_index, None):
            unfinished.append(adoption_record(name, manifest))
    if unfinished:
        logger.info("Finishing the deletion of %s that retention or cairn prune began: %s",
                    plural(len(unfinished), "checkpoint"), [r.dir_name for r in unfinished])
    return tuple(unfinished)
