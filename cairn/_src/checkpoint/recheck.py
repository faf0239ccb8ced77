"""Before a directory is deleted as uncommitted: ask storage again, and the event log.

A store may answer "not found" for an object it holds: a client that turns a timeout into
"nothing", an eventually consistent S3-compatible store. One such answer for a manifest
must not delete a committed checkpoint. So a directory Cairn is about to delete for want
of a manifest is checked again, by independent means:

1. the manifest is read again, several times with backoff;
2. a fresh listing of the directory is searched for it;
3. the run's event log is searched for the commit of its report.

Only when all of them agree that it never committed may it be deleted. When in doubt it
is left in place, with a warning saying why (a leftover costs space, never data).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cairn._src.checkpoint.manifest import MANIFEST_NAME, Manifest, read_manifest
from cairn._src.errors import (
    CheckpointDamagedError,
    CheckpointNotStoredError,
    ManifestError,
    StorageError,
)
from cairn._src.run.events import CheckpointDeleting, CheckpointStarted, Commit, Event, as_events
from cairn._src.run.layout import default_checkpoint_dir_name
from cairn._src.storage.checksum import FileEntry
from cairn._src.storage.fileio import list_dir_names, list_files
from cairn._src.storage.location import StorageLocation
from cairn._src.storage.retry import RetryPolicy

logger = logging.getLogger(__name__)

# The fewest reads of the manifest again, whatever the retry policy allows.
MIN_REREADS = 3


@dataclass(frozen=True)
class Recheck:
    """What storage and the event log say of a directory that looked uncommitted.

    ``manifest``: found after all (the checkpoint is committed). ``doubt``: why it must be
    left in place although no manifest could be read. Neither: it never committed.
    """

    manifest: Manifest | None = None
    doubt: str | None = None

    @property
    def never_committed(self) -> bool:
        return self.manifest is None and self.doubt is None


def committed_dir_names(events: Iterable[Event | Mapping[str, Any]]) -> set[str]:
    """The checkpoint directories whose commit the event log records (``events``: typed,
    or records as the log stores them).

    A ``commit`` event names its report; the directory is the report's default name, or
    the explicit one its ``checkpoint_started`` event announced. A directory whose
    deletion retention decided (a ``checkpoint_deleting`` event) is no longer one: a
    driver killed while deleting it leaves it without its manifest, on purpose.
    """
    committed: set[int] = set()
    announced: dict[int, str] = {}
    deleting: set[str] = set()
    for event in as_events(events):
        if isinstance(event, Commit) and type(event.index) is int:
            committed.add(event.index)
        elif (isinstance(event, CheckpointStarted) and type(event.index) is int
              and isinstance(event.dir_name, str)):
            announced[event.index] = event.dir_name
        elif isinstance(event, CheckpointDeleting) and isinstance(event.dir_name, str):
            deleting.add(event.dir_name)
    return {announced.get(index, default_checkpoint_dir_name(index))
            for index in committed} - deleting


def recheck_uncommitted(
    location: StorageLocation,
    name: str,
    retry: RetryPolicy,
    committed: Callable[[], set[str]],
    *,
    listed: Callable[[], set[str]] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Recheck:
    """Check again that ``location`` (the run's entry ``name``) holds no committed checkpoint.

    ``committed`` returns the directory names whose commit the event log records (read
    only when storage agrees that the manifest is missing). ``listed``, where given,
    returns the names a fresh listing of the run shows: a name neither listed nor
    committed in the event log has two independent answers besides the manifest's, so
    its manifest is read again once, without backoff (a resume over thousands of bogus
    index records would otherwise sleep for each). Storage errors propagate: an outage is
    no answer, and the caller leaves the directory for later.
    """
    absent = listed is not None and name not in listed() and name not in committed()
    for reread in range(1 if absent else max(MIN_REREADS, retry.max_attempts)):
        if not absent:
            sleep(retry.backoff(reread))
        try:
            manifest = read_manifest(location, retry)
        except CheckpointDamagedError as exc:
            return Recheck(doubt=f"its manifest exists but cannot be read ({exc})")
        if manifest is not None:
            return Recheck(manifest=manifest)
    # Only the top level can hold the manifest: not listed recursively, so that whatever
    # else a partial directory holds (a FIFO, a socket: list_files refuses them) never
    # makes the check fail.
    if MANIFEST_NAME in list_dir_names(location, retry):
        return Recheck(doubt="a fresh listing shows its manifest, which reads answered "
                             "as missing")
    if name in committed():
        return Recheck(doubt="the run's event log records its commit, yet storage answers "
                             "that its manifest is missing")
    return Recheck()


def manifest_asked_again(manifest_at: StorageLocation, name: str, retry: RetryPolicy,
                         committed: Callable[[], set[str]],
                         listed: Callable[[], set[str]]) -> Manifest:
    """The manifest of an indexed checkpoint storage answered as missing, read again;
    a StorageError (an outage: the attempt fails and the next one asks again) while
    the listing or the event log says it exists; ManifestError (damage) when all
    agree that it is gone. One answer never drops a committed checkpoint."""
    recheck = recheck_uncommitted(manifest_at, name, retry, committed, listed=listed)
    if recheck.manifest is not None:
        return recheck.manifest
    if recheck.doubt is not None:
        raise StorageError(f"{manifest_at.display()}: storage answers that its manifest "
                           f"is missing, but {recheck.doubt}; not resuming until it "
                           "answers consistently")
    raise ManifestError(f"{manifest_at.display()} has no manifest")


def commit_landed(location: StorageLocation, name: str, report_index: int, retry: RetryPolicy,
                  committed: Callable[[], set[str]]) -> bool:
    """Whether the commit of report ``report_index`` into ``location`` (the run's entry
    ``name``), which failed once its manifest write was attempted, landed: its manifest
    is there, of that report.

    A "not found" is asked again (:func:`recheck_uncommitted`): one answer never forgets
    a commit whose index write may have landed. While storage answers inconsistently, a
    :class:`StorageError` (the caller keeps the commit uncertain and asks again later).
    A manifest that cannot be read is not adopted (it is never resumed from either).
    """
    try:
        manifest = read_manifest(location, retry)
    except CheckpointDamagedError as exc:
        logger.warning("Not adopting %s: %s", name, exc)
        return False
    if manifest is None:
        recheck = recheck_uncommitted(location, name, retry, committed)
        if recheck.doubt is not None:
            raise StorageError(f"{location.display()}: the commit of report {report_index} "
                               "failed after its manifest write was attempted; storage "
                               f"answers that its manifest is missing, but {recheck.doubt}; "
                               "not going on until it answers consistently")
        manifest = recheck.manifest
    return manifest is not None and manifest.report_index == report_index


# How many of the missing or short files a message names.
_NAMED = 5


def check_stored(checkpoint_dir: StorageLocation, entries: Mapping[str, FileEntry],
                 retry: RetryPolicy) -> None:
    """Raise :class:`CheckpointNotStoredError` unless the store now holds every file of
    ``entries`` under ``checkpoint_dir`` at the size that was written.

    One recursive listing, before the manifest commits the checkpoint: a store that
    acknowledges writes and keeps nothing would otherwise produce committed checkpoints
    without data, found only at verify or restore.
    """
    stored = list_files(checkpoint_dir, retry)
    wrong = [f"{rel!r} is missing" if rel not in stored
             else f"{rel!r} holds {stored[rel]} bytes, {entry.size} were written"
             for rel, entry in sorted(entries.items()) if stored.get(rel) != entry.size]
    if wrong:
        more = f" (and {len(wrong) - _NAMED} more)" if len(wrong) > _NAMED else ""
        raise CheckpointNotStoredError(
            f"The store at {checkpoint_dir.display()} acknowledged every write of this "
            f"checkpoint, but a listing of it now shows: {'; '.join(wrong[:_NAMED])}{more}. "
            "It was not committed. The store loses data it acknowledged: check its client "
            "(a write that returns before it is stored, a timeout taken for success) or its "
            "consistency settings.")
