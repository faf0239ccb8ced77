"""Open a run directory at start-up: its index (read, else rebuilt), the references it
registered, and what a dead driver left behind settled (:mod:`.reconcile`).

Runs on the driver's calling thread before the checkpoint manager is built with what it
returns.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from cairn._src.checkpoint.index import Retention, RunIndex, read_index, rebuild_index
from cairn._src.checkpoint.ownership import Target, registered_references
from cairn._src.checkpoint.reconcile import reconcile
from cairn._src.config.run import CheckpointConfig
from cairn._src.errors import ManifestError
from cairn._src.run.events import (
    CheckpointDropped,
    CheckpointStarted,
    Commit,
    read_events,
)
from cairn._src.run.layout import EVENTS_DIR
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


def open_run(run: StorageLocation, config: CheckpointConfig, retry: RetryPolicy, *,
             durable: bool = True) -> OpenedRun:
    """Read the run's index (rebuilt from the manifests when damaged or lost while the run
    committed checkpoints), with ``config``'s retention settings, and reconcile it (an
    index written then is fsynced with ``durable``, the run's ``storage_fsync``)."""
    try:
        index = read_index(run, retry)
    except ManifestError as exc:
        logger.warning("%s; rebuilding the run index from the checkpoint manifests", exc)
        index = rebuild_index(run, retry)  # attempts and failures counted from the log
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
    events = read_events(run.join(EVENTS_DIR), retry)
    if index is None and any(isinstance(e, Commit) for e in events):
        # The index is gone but the run committed checkpoints: rebuild it from them.
        logger.warning("%s has no run index but committed checkpoints; rebuilding it "
                       "from the manifests", run.display())
        current = rebuild_index(run, retry).with_changes(retention=retention)
        index = current
    # What this run recorded decides what it may delete (ownership.py), never the
    # index alone.
    registered = registered_references(events)
    if index is not None:
        started = {str(e.dir_name) for e in events
                   if isinstance(e, CheckpointStarted) and e.dir_name is not None}
        # Dropped as damaged by an earlier resume: never adopted back.
        dropped = {str(e.dir_name) for e in events
                   if isinstance(e, CheckpointDropped) and e.dir_name is not None}
        current = reconcile(run, current, retry, started, dropped, durable=durable)
    return OpenedRun(current, registered)
