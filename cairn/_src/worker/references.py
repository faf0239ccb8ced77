"""A checkpoint a worker registers where it is, not uploaded: a NO_UPLOAD report's, or the
one a ``checkpoint_upload_fn`` returns.

The session (:mod:`.session`) takes the report's index and sends the intent; this module
checks the location and says what the intent holds. Both routes get the same checks
(:func:`~cairn._src.checkpoint.references.check_reference`, then that the directory
exists), so a reference never contains Cairn's data, whichever route registered it."""

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
    what = f"report(checkpoint={checkpoint!r}, checkpoint_upload_mode=NO_UPLOAD)"
    location = check_reference(checkpoint.location, run, retry, what=what)
    _check_directory(location, retry, what=what,
                     hint="Finish writing the checkpoint before reporting it.")
    return location


def uploaded_location(uploaded: Checkpoint, dir_name: str, run: StorageLocation,
                      retry: RetryPolicy, *, index: int) -> StorageLocation:
    """Where the checkpoint that report ``index``'s ``checkpoint_upload_fn`` returned
    (``uploaded``) lies, or raise :class:`ReportError`.

    The checks of :func:`reference_location`, with one place more accepted: the report's
    own directory ``<run>/<dir_name>`` and what lies inside it. That is where such a
    function writes (``build_checkpoint_path_from_name(dir_name)``, as in Ray Train), and
    a NO_UPLOAD report may not name it (Cairn's uploads use it). Nothing is committed
    there yet: the controller refuses a name already in use."""
    what = f"The checkpoint_upload_fn of report {index} returned {uploaded!r}"
    location = uploaded.location
    # Containment resolves links: an own directory that links to the run is the run.
    if not run.join(dir_name).contains(location) or location.contains(run):
        location = check_reference(location, run, retry, what=what)
    _check_directory(location, retry, what=what, hint=(
        "checkpoint_upload_fn must return the directory it uploaded the checkpoint to, once "
        "it is complete (for example Checkpoint(cairn.get_context().get_storage()"
        ".build_checkpoint_path_from_name(dir_name))), or raise."))
    return location


def _check_directory(location: StorageLocation, retry: RetryPolicy, *, what: str,
                     hint: str) -> None:
    if not is_dir(location, retry):
        raise ReportError(
            f"{what}: {location.display()} does not exist or is not a directory. {hint}")


def reference_intent(checkpoint: Checkpoint, location: StorageLocation, name: str,
                     dir_name: str | None,
                     validation: dict[str, Any] | None) -> CheckpointIntent:
    """The intent of a NO_UPLOAD report of ``checkpoint`` at ``location``, named ``name``
    (``dir_name``: the name the caller gave, or None)."""
    return CheckpointIntent(
        name, CheckpointUploadMode.NO_UPLOAD.value, reference=location, validation=validation,
        explicit_dir_name=dir_name is not None, metadata=checkpoint.get_metadata(),
        written=checkpoint._written)
