"""A node's verified copy of the newest committed checkpoint: restores without storage.

With ``CheckpointConfig(local_tier_bytes=N)`` and a run on remote storage, a worker that
uploads a checkpoint also copies the files it uploaded into a directory on its node,
``<local_tier_dir>/<run key>/<report index>-<dir_name>/``. A restarted worker on that
node restores from there when every file of the checkpoint's manifest is present with
its recorded size; the restore checks each file against the manifest's checksum (the one
computed while uploading) as it copies, as a restore from storage does. Any mismatch, a
missing file, a link or a FIFO in its place, drops the local copy with a warning and the
restore goes to storage: the local tier can make a restore faster, never wrong.

The copy lives in files, outside the worker process, so it survives the worker's crash
(``kill -9``, the OOM killer) and serves the next attempt's worker on the same node;
``local_tier_dir`` on a RAM file system (``/dev/shm/...``) keeps it in memory. Each node
holds at most ``local_tier_bytes`` per run: the newest committed checkpoint, and the one
being uploaded. Once a checkpoint commits, older ones of the run are removed from the
tier; a checkpoint larger than the bound (counting what is already there) is not copied.
Ranks that share a node add their files to the same directory, so a checkpoint every rank
of which ran on this node is restored whole from it; one with files from other nodes is
restored from storage.

A worker's session builds its run's tier and hands it, inside the run's
:class:`StorageOptions`, to the checkpoints it gives the train function
(``get_checkpoint()``, reported checkpoints); nothing else restores from it.

A tier is never used with local storage, whose restore is already a local copy. Copies
are best effort: an error while copying (a full disk) is logged once and the run goes on.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
import uuid
from collections.abc import Mapping

from cairn._src.checkpoint.manifest import Manifest
from cairn._src.errors import CairnError
from cairn._src.storage.checksum import FileEntry, new_hasher
from cairn._src.storage.fileio import TEMPORARY_MARK
from cairn._src.storage.location import StorageLocation, local_root, resolve
from cairn._src.storage.paths import check_relative_path
from cairn._src.storage.retry import RetryPolicy
from cairn._src.storage.transfer import download_directory

logger = logging.getLogger(__name__)

# Used when CheckpointConfig.local_tier_dir is None.
DIR_ENV = "CAIRN_LOCAL_TIER_DIR"


def default_directory() -> str:
    """``CAIRN_LOCAL_TIER_DIR``, else ``cairn-local-tier`` in the temp directory."""
    return os.environ.get(DIR_ENV) or os.path.join(tempfile.gettempdir(), "cairn-local-tier")


def _entry_name(report_index: int, dir_name: str) -> str:
    return f"{report_index:09d}-{dir_name}"


class LocalTier:
    """One run's local tier on this node (see the module docstring). Not thread-safe for
    concurrent :meth:`add` of one checkpoint from several threads of one process; ranks in
    separate processes may add to it at once."""

    def __init__(self, run: StorageLocation, directory: str, max_bytes: int) -> None:
        self._run = run
        self._max_bytes = max_bytes
        digest = new_hasher()
        digest.update(run.display().encode("utf-8"))
        self._root = os.path.join(os.path.abspath(directory), digest.hexdigest()[:24])
        self._warned = False

    @classmethod
    def for_run(cls, run: StorageLocation, directory: str | None,
                max_bytes: int) -> LocalTier | None:
        """The tier of ``run``, or None when it is off (no bound, or local storage)."""
        if max_bytes <= 0 or local_root(run.filesystem) is not None:
            return None
        return cls(run, directory or default_directory(), max_bytes)

    @property
    def run(self) -> StorageLocation:
        """The run whose checkpoints this tier holds."""
        return self._run

    @property
    def root(self) -> str:
        """This run's directory in the tier."""
        return self._root

    # --- filling (the worker that uploaded) -------------------------------------------

    def add(self, report_index: int, dir_name: str, source_dir: str,
            entries: Mapping[str, FileEntry]) -> bool:
        """Copy the files ``entries`` names from ``source_dir`` (what this worker just
        uploaded) into the tier; False when they do not fit or the copy failed."""
        size = sum(entry.size for entry in entries.values())
        try:
            self._make_root()
            if self._size_of(self._root) + size > self._max_bytes:
                logger.debug("Checkpoint %s (%d bytes) does not fit in the local tier "
                             "(%d bytes); not copied", dir_name, size, self._max_bytes)
                return False
            target = os.path.join(self._root, _entry_name(report_index, dir_name))
            for rel in sorted(entries):
                check_relative_path(rel, argument="entries")
                final = os.path.join(target, *rel.split("/"))
                os.makedirs(os.path.dirname(final), mode=0o700, exist_ok=True)
                temporary = os.path.join(os.path.dirname(final),
                                         f"{TEMPORARY_MARK}{uuid.uuid4().hex[:12]}")
                try:
                    shutil.copyfile(os.path.join(source_dir, *rel.split("/")), temporary,
                                    follow_symlinks=True)
                    os.replace(temporary, final)
                finally:
                    if os.path.lexists(temporary):
                        os.unlink(temporary)
            return True
        except (OSError, CairnError) as exc:
            self._warn_once(f"Could not copy checkpoint {dir_name} into the local tier "
                            f"{self._root} ({type(exc).__name__}: {exc}); restores on this "
                            "node read it from storage.")
            shutil.rmtree(os.path.join(self._root, _entry_name(report_index, dir_name)),
                          ignore_errors=True)
            return False

    def committed(self, report_index: int) -> None:
        """Report ``report_index`` committed: copies of older reports are dropped."""
        if not self._owned():
            return
        try:
            names = os.listdir(self._root)
        except OSError:
            return
        for name in names:
            index, _, _ = name.partition("-")
            if index.isdigit() and int(index) < report_index:
                shutil.rmtree(os.path.join(self._root, name), ignore_errors=True)

    # --- restoring --------------------------------------------------------------------

    def restore(self, manifest_location: StorageLocation, manifest: Manifest,
                target: str, retry: RetryPolicy) -> bool:
        """Restore the committed checkpoint whose manifest is ``manifest`` into ``target``
        from the tier; False (nothing usable here, or damage) means: restore from storage.
        """
        dir_name = manifest_location.path.rstrip("/").rsplit("/", 1)[-1]
        expected = self._run.join(dir_name)
        if manifest.report_index is None or (manifest_location.path, manifest_location.display(
        )) != (expected.path, expected.display()):
            return False  # not one of this run's checkpoints
        entry = os.path.join(self._root, _entry_name(manifest.report_index, dir_name))
        if not self._owned() or not self._holds(entry, manifest.files):
            return False
        try:
            download_directory(resolve(entry), target, files=manifest.files, verify=True,
                               retry=retry)
        except CairnError as exc:
            logger.warning("The local tier's copy of checkpoint %s on this node is damaged "
                           "(%s); it is dropped and the checkpoint is restored from "
                           "storage.", dir_name, exc)
            shutil.rmtree(entry, ignore_errors=True)
            return False
        logger.info("Restored checkpoint %s from this node's local tier (%s)", dir_name,
                    entry)
        return True

    # --- plumbing ---------------------------------------------------------------------

    def _holds(self, entry: str, files: Mapping[str, FileEntry]) -> bool:
        for rel, want in files.items():
            try:
                info = os.lstat(os.path.join(entry, *rel.split("/")))
            except OSError:
                return False
            if not stat.S_ISREG(info.st_mode) or info.st_size != want.size:
                return False
        return True

    def _make_root(self) -> None:
        os.makedirs(os.path.dirname(self._root), mode=0o700, exist_ok=True)
        os.makedirs(self._root, mode=0o700, exist_ok=True)
        if not self._owned():
            raise OSError(f"{self._root!r} or its parent is not a directory this user owns")

    def _owned(self) -> bool:
        """Whether the tier directory and its parent are real directories (not links) of
        this user: only then are its files read or deleted."""
        for path in (os.path.dirname(self._root), self._root):
            try:
                info = os.lstat(path)
            except OSError:
                return False
            if not stat.S_ISDIR(info.st_mode) or (
                    hasattr(os, "getuid") and info.st_uid != os.getuid()):
                return False
        return True

    @staticmethod
    def _size_of(root: str) -> int:
        total = 0
        for directory, _, names in os.walk(root):
            for name in names:
                try:
                    total += os.lstat(os.path.join(directory, name)).st_size
                except OSError:
                    pass
        return total

    def _warn_once(self, message: str) -> None:
        if self._warned:
            logger.debug(message)
            return
        self._warned = True
        logger.warning(message)
