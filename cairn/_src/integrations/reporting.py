"""What the framework callbacks share: their options, one report of a staged directory,
and the staging directories' lifetime.

A callback writes (or links) the framework's checkpoint into a fresh local staging
directory and reports that directory. With ``SYNC`` the staging directory is removed once
``report()`` returned (the checkpoint is committed by then). With ``ASYNC`` Cairn removes it
after a successful upload (``delete_local_checkpoint_after_upload=True``), but not when the
report is skipped (``upload_failure_policy="skip"``) or fails: :class:`StagingFolders` keeps
each ASYNC report's handle with its directory and removes the directory once the handle is
done, whatever the outcome. A killed attempt's directories are removed when the next
attempt's callback starts: their names carry the run and attempt (:func:`staging_token`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any

from cairn._src.checkpoint.checkpoint import Checkpoint
from cairn._src.config.run import CheckpointUploadMode
from cairn._src.config.validation import ValidationTaskConfig
from cairn._src.errors import ConfigError
from cairn._src.train.api import get_context, report
from cairn._src.worker.report_handle import ReportHandle

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReportOptions:
    """How a callback reports: the upload mode and the validation request."""

    checkpoint_upload_mode: CheckpointUploadMode
    validation: bool | ValidationTaskConfig

    @classmethod
    def parse(cls, owner: str, checkpoint_upload_mode: object,
              validation: object) -> ReportOptions:
        """Checked options; a :class:`ConfigError` naming ``owner``'s argument otherwise."""
        accepted = "is not one of 'SYNC', 'ASYNC' (a name or a cairn.CheckpointUploadMode)"
        try:
            mode = (CheckpointUploadMode.SYNC if checkpoint_upload_mode is None
                    else CheckpointUploadMode.parse(checkpoint_upload_mode))
        except ConfigError:
            raise ConfigError(f"{owner}(checkpoint_upload_mode={checkpoint_upload_mode!r}) "
                              f"{accepted}.") from None
        if mode is CheckpointUploadMode.NO_UPLOAD:
            raise ConfigError(
                f"{owner}(checkpoint_upload_mode={checkpoint_upload_mode!r}) is not accepted: "
                "the callback writes the checkpoint to a local directory that must be "
                "uploaded; use 'SYNC' (the default) or 'ASYNC'."
            )
        if not (isinstance(validation, bool) or isinstance(validation, ValidationTaskConfig)):
            raise ConfigError(
                f"{owner}(validation={validation!r}) must be True, False or a "
                "cairn.ValidationTaskConfig."
            )
        return cls(mode, validation)


def run_token() -> str:
    """A short name of this run (its storage location), for staging directory names."""
    storage = get_context().get_storage()
    return hashlib.sha256((storage.run_uri or storage.run_path).encode()).hexdigest()[:12]


def staging_token() -> str:
    """``<run>-a<attempt>``: the same on every rank of this attempt, and different for any
    other attempt of this run (attempts count on across driver restarts) or another run."""
    return f"{run_token()}-a{get_context().get_attempt()}"


def remove_stale(parent: str, prefix: str, current: str) -> None:
    """Remove the entries of ``parent`` named ``prefix*`` but not ``current*``: what an
    earlier attempt (killed, or ended before its uploads resolved) left there."""
    try:
        names = os.listdir(parent)
    except FileNotFoundError:
        return
    for name in names:
        if name.startswith(prefix) and not name.startswith(current):
            logger.debug("Removing %s, a staging directory an earlier attempt left",
                         os.path.join(parent, name))
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


@dataclass
class StagingFolders:
    """The staging directories of a callback's ASYNC reports, each with its report's handle:
    a directory goes once its handle is done (committed, skipped or failed)."""

    pending: list[tuple[ReportHandle, str]] = field(default_factory=list)

    def add(self, handle: ReportHandle | None, staging: str) -> None:
        if handle is not None and os.path.isdir(staging):
            self.pending.append((handle, staging))

    def sweep(self) -> None:
        """Remove the directories whose reports are done; keep the others."""
        still: list[tuple[ReportHandle, str]] = []
        for handle, staging in self.pending:
            if handle.done():
                shutil.rmtree(staging, ignore_errors=True)
            else:
                still.append((handle, staging))
        self.pending = still

    def drain(self) -> None:
        """Wait for every pending report, removing each directory once its report is done.
        A failed or skipped upload is not raised here: Cairn raises a failure itself, at
        the next report or when the train function returns."""
        pending, self.pending = self.pending, []
        for handle, staging in pending:
            try:
                handle.wait()
            except Exception:
                pass
            finally:
                shutil.rmtree(staging, ignore_errors=True)


def staging_directory(prefix: str, parent: str | None = None) -> str:
    """A new, empty local directory for one checkpoint, under ``parent`` (created if
    needed) or the temporary directory."""
    if parent is not None:
        os.makedirs(parent, exist_ok=True)
    return tempfile.mkdtemp(prefix=prefix, dir=parent)


def has_files(directory: str) -> bool:
    """Whether ``directory`` holds at least one file, at any depth."""
    return any(files for _, _, files in os.walk(directory))


def report_staged(metrics: dict[str, Any], staging: str, options: ReportOptions,
                  folders: StagingFolders | None = None) -> None:
    """Report ``metrics`` with the files under ``staging`` (none: a metric-only report),
    then remove ``staging``: at once for SYNC; for ASYNC, Cairn removes it after a
    successful upload, and ``folders`` keeps it until the report is done otherwise.

    Every rank must call this once per save, so that report numbers stay aligned; a rank
    with nothing in ``staging`` reports ``checkpoint=None`` and the other ranks' files make
    the checkpoint.
    """
    asynchronous = options.checkpoint_upload_mode is CheckpointUploadMode.ASYNC
    removed_by_cairn = False
    try:
        if has_files(staging):
            handle = report(
                metrics,
                checkpoint=Checkpoint.from_directory(staging),
                checkpoint_upload_mode=options.checkpoint_upload_mode,
                delete_local_checkpoint_after_upload=True if asynchronous else None,
                validation=options.validation,
            )
            removed_by_cairn = asynchronous
            if asynchronous and folders is not None:
                folders.add(handle, staging)
        else:
            report(metrics)
    finally:
        if not removed_by_cairn:
            shutil.rmtree(staging, ignore_errors=True)
