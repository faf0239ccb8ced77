"""What the framework callbacks share: their options, and one report of a staged directory.

A callback writes (or links) the framework's checkpoint into a fresh local staging
directory and reports that directory. With ``SYNC`` the staging directory is removed once
``report()`` returned (the checkpoint is committed by then); with ``ASYNC`` Cairn removes
it after the upload (``delete_local_checkpoint_after_upload=True``).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

from cairn._src.checkpoint.checkpoint import Checkpoint
from cairn._src.config.run import CheckpointUploadMode
from cairn._src.config.validation import ValidationTaskConfig
from cairn._src.errors import ConfigError
from cairn._src.train.api import report

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
        if checkpoint_upload_mode is None:
            mode = CheckpointUploadMode.SYNC
        else:
            mode = CheckpointUploadMode.parse(
                checkpoint_upload_mode, argument=f"{owner}(checkpoint_upload_mode)")
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


def staging_directory(prefix: str, parent: str | None = None) -> str:
    """A new, empty local directory for one checkpoint, under ``parent`` (created if
    needed) or the temporary directory."""
    if parent is not None:
        os.makedirs(parent, exist_ok=True)
    return tempfile.mkdtemp(prefix=prefix, dir=parent)


def has_files(directory: str) -> bool:
    """Whether ``directory`` holds at least one file, at any depth."""
    return any(files for _, _, files in os.walk(directory))


def report_staged(metrics: dict[str, Any], staging: str, options: ReportOptions) -> None:
    """Report ``metrics`` with the files under ``staging`` (none: a metric-only report),
    then remove ``staging`` (after the upload, for ASYNC).

    Every rank must call this once per save, so that report numbers stay aligned; a rank
    with nothing in ``staging`` reports ``checkpoint=None`` and the other ranks' files make
    the checkpoint.
    """
    asynchronous = options.checkpoint_upload_mode is CheckpointUploadMode.ASYNC
    removed_by_cairn = False
    try:
        if has_files(staging):
            report(
                metrics,
                checkpoint=Checkpoint.from_directory(staging),
                checkpoint_upload_mode=options.checkpoint_upload_mode,
                delete_local_checkpoint_after_upload=True if asynchronous else None,
                validation=options.validation,
            )
            removed_by_cairn = asynchronous
        else:
            report(metrics)
    finally:
        if not removed_by_cairn:
            shutil.rmtree(staging, ignore_errors=True)
