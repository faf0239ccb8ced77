"""A NO_UPLOAD report of a worker: its checkpoint is registered where it is, not uploaded.

The session (:mod:`.session`) takes the report's index and sends the intent; this module
checks the location and says what the intent holds."""

from __future__ import annotations

from typing import Any

from cairn._src.checkpoint.checkpoint import Checkpoint
from cairn._src.checkpoint.references import check_reference
from cairn._src.config.run import CheckpointUploadMode
from cairn._src.errors import ReportError
from cairn._src.storage.fileio import is_dir
from cairn._src.storage.location import StorageLocation
from cairn._src.storage.retry import RetryPolicy
from cairn._src.wire.messages import CheckpointIntent


def reference_location(checkpoint: Checkpoint, run: StorageLocation,
                       retry: RetryPolicy) -> StorageLocation:
    """Where the NO_UPLOAD ``checkpoint`` stays, or raise :class:`ReportError`.

    Refuses what no new process could reach, credentials in the URI, Cairn's own data and
    a directory that does not exist (yet); a path on the run's storage filesystem comes back
    bound to the run's store."""
    location = check_reference(
        checkpoint.location, run, retry,
        what=f"report(checkpoint={checkpoint!r}, checkpoint_upload_mode=NO_UPLOAD)")
    if not is_dir(location, retry):
        raise ReportError(
            f"report(checkpoint={checkpoint!r}, checkpoint_upload_mode=NO_UPLOAD): "
            f"{location.display()} does not exist or is not a directory. Finish writing the "
            "checkpoint before reporting it."
        )
    return location


def reference_intent(checkpoint: Checkpoint, location: StorageLocation, name: str,
                     dir_name: str | None,
                     validation: dict[str, Any] | None) -> CheckpointIntent:
    """The intent of a NO_UPLOAD report of ``checkpoint`` at ``location``, named ``name``
    (``dir_name``: the name the caller gave, or None)."""
    return CheckpointIntent(
        name, CheckpointUploadMode.NO_UPLOAD.value, reference=location, validation=validation,
        explicit_dir_name=dir_name is not None, metadata=checkpoint.get_metadata(),
        written=checkpoint._written)
