"""One checkpoint upload of a worker: the job the session queues, the answer it waits
for, and the upload of its files (:func:`upload_files`), shared directories included.

The session (:mod:`.session`) runs a job on the calling thread (SYNC) or on its
``cairn-uploader`` thread (ASYNC), which :func:`lower_thread_priority` lowers.

A checkpoint already on a store (S3, a registered scheme: any filesystem but the local
disk) is copied store to store (:func:`~cairn._src.storage.store_copy.copy_directory`),
checksummed as it streams, like a local directory is uploaded; it is the user's data, so
it is deleted afterwards only when ``delete_local_checkpoint_after_upload=True`` says so.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs

from cairn._src.checkpoint.checkpoint import METADATA_FILE_NAME, Checkpoint
from cairn._src.config.validation import task_for_report
from cairn._src.errors import CairnError, ReportError
from cairn._src.run.layout import MANIFEST_NAME
from cairn._src.storage import scratch
from cairn._src.storage.durability import sync_uploaded
from cairn._src.storage.fileio import delete_dir, delete_file, exists, is_dir, list_files
from cairn._src.storage.location import StorageLocation, resolve
from cairn._src.storage.options import StorageOptions
from cairn._src.storage.paths import list_local_files
from cairn._src.storage.reader import local_os_path
from cairn._src.storage.retry import RetryPolicy
from cairn._src.storage.store_copy import copy_directory
from cairn._src.storage.transfer import FileEntry, compute_entries, upload_directory
from cairn._src.wire.messages import ProceedMessage, UploadedMessage
from cairn._src.worker.references import uploaded_location
from cairn._src.worker.report_handle import ReportHandle
from cairn._src.worker.upload_errors import missing_file, vanished_files

logger = logging.getLogger(__name__)

UploadFn = Callable[[Checkpoint, str], Checkpoint]


class Waiter:
    """One pending answer from the controller for a report index.

    A later answer replaces an earlier one not taken yet (a refusal after the go-ahead),
    except a ``final`` one: the report was resolved (skipped) before its verdict came,
    and a verdict that arrives after that is ignored."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.value: object = None
        self._final = False

    def set(self, value: object, *, final: bool = False) -> None:
        if self._final:
            return
        self.value, self._final = value, final
        self.event.set()

    def get(self) -> object:
        self.event.wait()
        return self.value


@dataclass
class UploadJob:
    index: int
    dir_name: str
    checkpoint: Checkpoint
    files: dict[str, int]
    upload_fn: UploadFn | None
    delete_local: bool
    handle: ReportHandle
    metadata: dict[str, Any]
    write: Callable[[str], None] | None = None
    validation: dict[str, Any] | None = None
    # local_dir_identity of the directory (None: a private one, or an upload function).
    source: str | None = None
    # What the commit resolves when the local directory is deleted only after the commit
    # (other ranks may share it): ``handle`` is resolved once it is gone.
    inner: ReportHandle | None = None
    # This rank's part went to the controller (uploaded, or none to upload).
    sent: bool = False
    # Uploaded by the upload thread while the training loop runs (ASYNC).
    background: bool = False
    # Files of it were gone when its upload read them: the report may yet fail for that,
    # and then the directory stays with the user, as after a failed upload.
    vanished: bool = False

    @property
    def removable(self) -> bool:
        """Whether the train function may have removed the directory (or a file of it)
        before this upload read it: its own local directory, uploaded in the background."""
        return (self.background and self.upload_fn is None and self.write is None
                and is_local_source(self.checkpoint))


def is_local_source(checkpoint: Checkpoint) -> bool:
    """Whether ``checkpoint`` is a directory on this machine's disk (uploaded from its OS
    path), not one on a store (copied store to store)."""
    return isinstance(checkpoint.filesystem, pafs.LocalFileSystem)


def list_stored_source(checkpoint: Checkpoint, retry: RetryPolicy, *,
                       what: str) -> dict[str, int]:
    """The files (relative path -> size) to copy of ``checkpoint``, a directory on a store.
    Raises :class:`ReportError` when the directory does not exist.
    """
    location = checkpoint.location
    try:
        if not is_dir(location, retry):
            raise ReportError(
                f"{what}: {location.display()} does not exist or is not a directory. Finish "
                "writing the checkpoint before reporting it."
            )
        files = list_files(location, retry)
    except ReportError:
        raise
    except CairnError as exc:
        raise ReportError(f"{what}: {exc}") from exc
    return files


def delete_after_upload(asked: bool | None, background: bool, checkpoint: Checkpoint) -> bool:
    """Whether the source of an upload goes once it is on storage: as ``asked``; by
    default after an ASYNC (``background``) upload of a local directory, as in Ray Train,
    and never for a checkpoint already on a store, which is the user's data, not a local
    copy (an explicit True deletes it, as Ray Train does)."""
    if asked is not None:
        return asked
    return background and is_local_source(checkpoint)


def delete_source(checkpoint: Checkpoint, retry: RetryPolicy) -> None:
    """Delete the source directory of a finished upload; a failure is logged, not raised
    (the checkpoint is on storage). A committed checkpoint (one holding a manifest, such
    as ``get_checkpoint()`` reported again) is never deleted this way: only retention
    deletes what Cairn committed."""
    location = checkpoint.location
    try:
        if exists(location.join(MANIFEST_NAME), retry):
            logger.warning("Not deleting %s after uploading it: it is a committed checkpoint",
                           location.display())
            return
        if is_local_source(checkpoint):
            shutil.rmtree(checkpoint.path, ignore_errors=True)
        else:
            delete_dir(location, retry)
    except CairnError as exc:
        logger.warning("Could not delete %s after uploading it: %s", location.display(), exc)


def unchanged_files(directory: str, files: dict[str, int], earlier: dict[str, FileEntry],
                    skipped: set[str], retry: RetryPolicy) -> dict[str, FileEntry]:
    """Of what the first upload of a shared ``directory`` wrote (``earlier``), the files
    it still holds as they were (``files``: its listing now; ``skipped``: paths another
    rank uploads): hashed again here, a local read, and not written again. The same size
    with other bytes is a change; a file that changes while it is read makes this return
    nothing, so that everything is uploaded."""
    same_size = sorted(rel for rel, entry in earlier.items()
                       if rel not in skipped and files.get(rel) == entry.size)
    if not same_size:
        return {}
    try:
        now = compute_entries(resolve(directory), same_size, retry=retry, follow_links=True)
    except CairnError:
        return {}
    return {rel: entry for rel, entry in now.items() if entry == earlier[rel]}


def deferred_directory() -> str:
    """The path of a deferred report's private temporary directory, not created yet: only
    :func:`write_deferred` creates it, so that a snapshot serialized straight into storage
    (:mod:`.direct_write`) leaves no empty directory behind."""
    # Named after this process: a worker killed (kill -9) while writing it cannot remove
    # it; the local backend sweeps those of processes that are gone (storage/scratch.py).
    return scratch.new_path()


def write_deferred(job: UploadJob) -> None:
    """Create a deferred report's private directory (as ``mkdtemp`` would: owner only,
    never one that exists), run ``write`` into it; it must write what it declared."""
    assert job.write is not None
    os.mkdir(job.checkpoint.path, 0o700)
    job.write(job.checkpoint.path)
    written = set(list_local_files(job.checkpoint.path))
    if written != set(job.files):
        missing = sorted(set(job.files) - written)
        extra = sorted(written - set(job.files))
        raise ReportError(
            f"The deferred checkpoint of report {job.index} did not write the files it "
            f"declared: missing {missing}, undeclared {extra}."
        )


def upload_with_function(job: UploadJob, rank: int, started: float,
                         options: StorageOptions, *, run: StorageLocation) -> UploadedMessage:
    """Run the report's ``checkpoint_upload_fn``; the checkpoint it returns is the upload.

    What it returns is checked as a NO_UPLOAD checkpoint is (:func:`uploaded_location`:
    an existing directory that holds none of Cairn's data of the ``run``, its own
    directory in the run excepted), and :class:`ReportError` says what was wrong; the
    report then fails as an upload that failed does. With ``options.fsync``, a returned
    directory on the local disk is made durable before it is announced, as Cairn's own
    uploads are (the function wrote it, often into the run's own directory, without an
    fsync)."""
    assert job.upload_fn is not None
    uploaded = job.upload_fn(job.checkpoint, job.dir_name)
    if not isinstance(uploaded, Checkpoint):
        raise ReportError(
            "checkpoint_upload_fn must return a `ray.train.Checkpoint`: in Cairn, "
            f"the cairn.Checkpoint it uploaded; it returned {uploaded!r}.")
    location = uploaded_location(uploaded, job.dir_name, run, options.retry, index=job.index)
    root = local_os_path(location)
    if options.fsync and root is not None:
        sync_uploaded(root, _regular_files(root))
    return UploadedMessage(rank, job.index, {}, location, 0,
                           time.perf_counter() - started, written=uploaded._written)


def _regular_files(root: str) -> list[str]:
    """The regular files under ``root`` (``/``-relative), no link followed."""
    found: list[str] = []
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            if os.path.isfile(path) and not os.path.islink(path):
                found.append(os.path.relpath(path, root).replace(os.sep, "/"))
    return found


def upload_files(job: UploadJob, answer: object, destination: StorageLocation, rank: int,
                 started: float, *, options: StorageOptions, policy: str,
                 list_files: Callable[[], dict[str, int]]) -> UploadedMessage:
    """Upload ``job``'s files to ``destination`` with checksums, as the controller's
    ``answer`` says (a :class:`ProceedMessage`: paths another rank uploads are hashed, not
    written; a directory shared by ranks is listed again, complete now, through
    ``list_files``, and what its first upload wrote unchanged is not written again)."""
    retry = options.retry
    skipped = set(answer.duplicates) if isinstance(answer, ProceedMessage) else set()
    files = job.files
    unchanged: dict[str, FileEntry] = {}
    if isinstance(answer, ProceedMessage) and answer.shared == "upload":
        # Every rank sharing the directory has reported: it is complete now, while the
        # listing taken at report() may have caught a shard still being written by
        # another rank.
        files = list_files()
        skipped &= set(files)
        unchanged = unchanged_files(job.checkpoint.path, files, answer.stale, skipped, retry)
    wanted = {f: size for f, size in files.items() if f not in skipped and f not in unchanged}
    local = is_local_source(job.checkpoint)
    # A first upload of a local directory goes on without a file listed at report() and
    # gone now, the directory still there: a rank that reports this directory later may
    # have renamed it (its upload, once every rank reported, replaces this one); the
    # controller decides.
    first = local and not (isinstance(answer, ProceedMessage) and answer.shared == "upload")
    vanished: list[str] = []
    if local:
        written, vanished = _skipping_vanished(
            job.checkpoint.path, wanted, first, lambda files: upload_directory(
                job.checkpoint.path, destination, files=files, retry=retry,
                background=job.background, transfer=options.transfer))
    else:
        written = copy_directory(job.checkpoint.location, destination, files=wanted,
                                 retry=retry, transfer=options.transfer)
    entries = dict(sorted({**written, **unchanged}.items()))
    sync_written(destination, written, options)
    if isinstance(answer, ProceedMessage) and answer.stale:
        # Written by the first upload of this directory and gone since (a temporary file
        # renamed): not part of the checkpoint.
        gone = sorted(set(answer.stale) - set(files))
        for rel in gone:
            delete_file(destination.join(rel), retry)
        _remove_emptied_directories(destination, gone)
    # Paths another rank uploads: hashed here, not written, so the controller can tell
    # identical copies (stored once) from a collision.
    source = resolve(job.checkpoint.path) if local else job.checkpoint.location
    duplicates: dict[str, FileEntry] = {}
    if skipped:
        duplicates, gone = _skipping_vanished(
            job.checkpoint.path, dict.fromkeys(skipped, 0), first,
            lambda files: compute_entries(source, sorted(files), retry=retry,
                                          follow_links=local))
        vanished += gone
    job.vanished = bool(vanished)
    size = sum(entry.size for entry in written.values())
    return UploadedMessage(rank, job.index, entries, None, size,
                           time.perf_counter() - started, duplicates=duplicates,
                           vanished=vanished_files(
                               rank, job.index, job.checkpoint.path, sorted(vanished),
                               removable=job.removable, policy=policy) if vanished else None)


def _skipping_vanished(directory: str, wanted: dict[str, int], first: bool,
                       run: Callable[[dict[str, int]], dict[str, FileEntry]],
                       ) -> tuple[dict[str, FileEntry], list[str]]:
    """``run(wanted)``; for a ``first`` upload, once more without each file of
    ``wanted`` found gone from ``directory`` when it fails: its result, and those files."""
    vanished: list[str] = []
    while True:
        try:
            return run(wanted), vanished
        except Exception as exc:
            gone = _vanished(directory, wanted, exc) if first else []
            if not gone:
                raise
            vanished += gone
            wanted = {f: size for f, size in wanted.items() if f not in gone}


def _vanished(directory: str, wanted: dict[str, int], error: BaseException) -> list[str]:
    """The files of ``wanted`` no longer under ``directory`` when ``error`` (an upload's)
    is a file that is not there and the directory still is; [] otherwise."""
    if missing_file(error) is None or not os.path.isdir(directory):
        return []
    return [rel for rel in wanted
            if not os.path.lexists(os.path.join(directory, *rel.split("/")))]


def _remove_emptied_directories(destination: StorageLocation, removed: list[str]) -> None:
    """The directories of ``removed`` (files just deleted under a local ``destination``)
    that hold nothing now (a directory renamed since the first upload, ``part.tmp/`` to
    ``part/``): not left empty in the checkpoint. ``os.rmdir`` removes only empty ones."""
    root = local_os_path(destination)
    if root is None:
        return  # an object store has no directories of its own
    parents = {"/".join(rel.split("/")[:n]) for rel in removed
               for n in range(1, rel.count("/") + 1)}
    for parent in sorted(parents, key=lambda d: d.count("/"), reverse=True):
        try:
            os.rmdir(os.path.join(root, *parent.split("/")))
        except OSError:
            pass  # not empty, or not there


def sync_written(destination: StorageLocation, written: dict[str, FileEntry],
                 options: StorageOptions) -> None:
    """With ``options.fsync``, make the files just ``written`` under a local
    ``destination`` durable before they are announced (:mod:`.durability`): the manifest
    that the commit writes next may name only data that is on the disk."""
    root = local_os_path(destination)
    if options.fsync and root is not None and written:
        sync_uploaded(root, written)


def resolve_after_commit(job: UploadJob, retry: RetryPolicy) -> None:
    """Delete a directory kept until the report resolved, then resolve ``handle``.

    Only a report that committed deletes it: one refused (before or after this rank's
    upload), skipped or stopped keeps the user's directory, and so does a committed
    checkpoint reported again (:func:`delete_source`).
    """
    inner = job.inner
    if inner is None or not inner.done():
        return
    if job.sent and inner._error is None:
        delete_source(job.checkpoint, retry)
    job.handle._resolve(inner._checkpoint, inner._error)


# How much lower than the train loop's the background upload threads' CPU priority is.
BACKGROUND_NICENESS = 10


def lower_thread_priority(increment: int = BACKGROUND_NICENESS) -> None:
    """Give the calling thread a lower CPU priority (Linux: niceness is per thread, and the
    threads it starts, such as a transfer's pool, inherit it): ASYNC uploads, checksums and
    snapshot serialization then take the cores the train loop leaves, rather than share
    them with it. Silently nothing where threads have no niceness of their own."""
    if not sys.platform.startswith("linux"):
        return
    try:
        thread = threading.get_native_id()
        current = os.getpriority(os.PRIO_PROCESS, thread)
        os.setpriority(os.PRIO_PROCESS, thread, min(19, current + increment))
    except (AttributeError, OSError):
        pass


def validation_task(validation: object, checkpoint: Checkpoint | None, *,
                    enabled: bool) -> dict[str, Any] | None:
    """The validation task of ``report(validation=...)`` (None: none asked); ``enabled``:
    whether the trainer has a ``ValidationConfig``."""
    task = task_for_report(validation)
    if task is None:
        return None
    if checkpoint is None:
        raise ReportError(
            f"report(validation={validation!r}) was given without a checkpoint. "
            "Validation requires a checkpoint to be provided."
        )
    if not enabled:
        raise ReportError(
            f"report(validation={validation!r}): `validation_config` was not set on the "
            "trainer, but a validation was requested. Pass Trainer(..., "
            "validation_config=cairn.ValidationConfig(fn)) or drop validation=."
        )
    return task


def checkpoint_files(checkpoint: Checkpoint,
                     retry: RetryPolicy) -> tuple[dict[str, int], bool]:
    """The files to upload, and whether ``checkpoint`` may carry metadata to read with
    ``get_metadata()``: a ``.metadata.json`` file (set before the report, or written by
    ``to_directory()`` of a committed checkpoint), or a manifest (a committed checkpoint
    reported again; one registered by reference keeps its manifest elsewhere). Metadata
    travels in the manifest, never as a file. A committed checkpoint's manifest is not
    copied: the copy commits with its own. A checkpoint on a store is listed there (it is
    copied from there)."""
    if not is_local_source(checkpoint):
        files = list_stored_source(checkpoint, retry, what=f"report(checkpoint={checkpoint!r})")
    else:
        try:
            files = list_local_files(checkpoint.path)
        except CairnError as exc:
            raise ReportError(f"report(checkpoint=...): {exc}") from exc
    committed = files.pop(MANIFEST_NAME, None) is not None or checkpoint._committed
    has_file = files.pop(METADATA_FILE_NAME, None) is not None
    return files, committed or has_file
