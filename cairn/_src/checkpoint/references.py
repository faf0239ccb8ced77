"""What a worker's ``report()`` may hand Cairn to keep: checks on checkpoint locations.

Called in the worker, at ``report()``, so a bad checkpoint is refused where the mistake was
made and before anything is written (contract items 5, 12 and 13):

* :func:`check_reference` for a NO_UPLOAD checkpoint. A reference is data Cairn may later
  forget or (when the user asks) delete, so it may not contain Cairn's own data: not the
  run directory, not one of its ancestors (the storage root holds other runs), not the
  run's ``metrics/`` or ``events/``, not another checkpoint's directory (a direct child of
  the run holding a manifest) or a direct child named as Cairn names its uploads
  (``checkpoint_000007``: a later upload would go there, and a sweep of uploads that never
  committed would delete it), nothing inside those, and no directory holding a manifest
  anywhere below it. Its location must be one a new process can reach again: a URI, or a
  path on the run's own storage filesystem, which is then recorded as a path on that
  filesystem. A URI it persists may not carry credentials.
* :func:`check_upload_source` for a SYNC or ASYNC checkpoint: its directory, local or on
  any store, may not contain the run's storage, or the upload would copy the run into
  itself and the deletion after upload would remove the run ("Ray Train's experiment
  directory is contained within the checkpoint path", as Ray Train says).
* :func:`check_persisted_uri` for any URI Cairn is about to write to storage.

The checks read storage only to look for manifests (one listing of the reference) and
otherwise decide from the locations alone.
"""

from __future__ import annotations

import os
import stat

from cairn._src.errors import ReportError
from cairn._src.run.layout import (
    EVENTS_DIR,
    MANIFEST_NAME,
    METRICS_DIR,
    looks_like_default_dir_name,
)
from cairn._src.storage.fileio import exists, list_files
from cairn._src.storage.location import StorageLocation, local_root
from cairn._src.storage.retry import RetryPolicy
from cairn._src.storage.uris import credentials_in, local_os_join, public_uri

__all__ = ["check_persisted_uri", "check_reference", "check_upload_source", "rebind_to_run"]

_CREDENTIAL_HINT = (
    "Cairn writes this URI to the run's storage, and credentials never reach storage: give "
    "the credentials through the environment (for S3: AWS_ACCESS_KEY_ID and "
    "AWS_SECRET_ACCESS_KEY), a credential chain (a profile, an instance role), or a URI "
    "scheme registered with cairn.storage.register_scheme() whose factory reads them, and "
    "pass the URI without them"
)


def check_persisted_uri(uri: str, *, what: str) -> None:
    """Raise :class:`ReportError` when ``uri`` (which Cairn must persist) carries
    credentials. ``what`` names the argument in the message; the message shows only the
    credential-free form of the URI."""
    found = credentials_in(uri)
    if found:
        raise ReportError(
            f"{what} is {public_uri(uri)!r} with {' and '.join(found)}. {_CREDENTIAL_HINT}."
        )


def check_reference(
    location: StorageLocation, run: StorageLocation, retry: RetryPolicy, *, what: str
) -> StorageLocation:
    """The location to register for a NO_UPLOAD checkpoint at ``location``, or raise.

    ``run`` is the run directory; ``what`` describes the report for messages (for example
    ``"report(checkpoint=Checkpoint('/data/x'), checkpoint_upload_mode=NO_UPLOAD)"``).
    A location on the run's own storage filesystem (the same object, a copy of it, or one
    whose ``equals()`` says so) comes back rebound to the run's store, so that it is
    recorded as a path there even without a URI. Raises :class:`ReportError` for a
    location no new process could reach, one with credentials in its URI, and one that
    contains or lies inside Cairn's own data (see the module docstring).
    """
    if location.uri is None:
        location = rebind_to_run(location, run, what=what)
    elif location.in_process:
        raise ReportError(
            f"{what} is in an in-process store ({location.display()}): a restarted driver "
            "would find it empty. Put the checkpoint on the run's storage, on a local "
            "directory or remote URI, or under a URI scheme registered with "
            "cairn.storage.register_scheme() whose store lives outside this process."
        )
    else:
        check_persisted_uri(location.uri, what=f"{what}: the checkpoint's URI")
    # The run directory and its ancestors first, by their paths alone: walking a storage
    # root would meet the run's own retention deleting a checkpoint meanwhile.
    _check_not_holding_run(location, run, what=what)
    _check_regular_files_only(location, what=what)
    _check_not_cairn_data(location, run, retry, what=what)
    return location


def _special_entry(directory: str) -> tuple[str, str] | None:
    """The first entry below ``directory`` (links not followed) that is neither a regular
    file nor a directory, and what it is; None when there is none."""
    stack = [directory]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                if entry.is_symlink():
                    return entry.path, "a symbolic link"
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif not entry.is_file(follow_symlinks=False):
                    mode = entry.stat(follow_symlinks=False).st_mode
                    kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a socket"
                            if stat.S_ISSOCK(mode) else "a device")
                    return entry.path, kind
    return None


def _check_regular_files_only(location: StorageLocation, *, what: str) -> None:
    """Raise :class:`ReportError` when a local reference holds a link, FIFO, socket or
    device: the commit reads a reference in place and refuses them, which would fail the
    run; refused here, the train function can catch the error and go on."""
    root = local_root(location.filesystem)
    if root is None:
        return  # object stores and remote file systems hold no links or devices
    path = local_os_join(root, location.path)
    if not os.path.isdir(path):
        return  # report() says it does not exist
    try:
        found = _special_entry(path)
    except OSError as exc:
        raise ReportError(f"{what}: {location.display()} cannot be listed ({exc}).") from exc
    if found is not None:
        entry, kind = found
        raise ReportError(
            f"{what}: {entry!r} is {kind}. A checkpoint registered by reference is read in "
            "place and may hold regular files and directories only: copy the data into the "
            "directory instead of linking to it, or report it with "
            "checkpoint_upload_mode=SYNC or ASYNC, which copy what a link inside the "
            "directory points to."
        )


def rebind_to_run(location: StorageLocation, run: StorageLocation, *,
                  what: str) -> StorageLocation:
    """``location`` (which has no URI) as a location on ``run``'s store object, or raise
    :class:`ReportError` when it is on another filesystem object."""
    if not run.same_store(location):
        raise ReportError(
            f"{what} ({location.display()}) is on a filesystem object that is not the run's "
            "storage and has no URI, so Cairn could not reach it again after a driver "
            "restart. Use the run's own storage filesystem (Checkpoint(path, filesystem="
            "cairn.get_context().get_storage().storage_filesystem)), or a URI under a "
            "scheme registered with cairn.storage.register_scheme()."
        )
    return run.with_path(location.path)


def _check_not_holding_run(location: StorageLocation, run: StorageLocation, *,
                           what: str) -> None:
    if location.contains(run):
        relation = (f"is the run directory {run.display()}" if run.contains(location) else
                    f"is an ancestor of the run directory {run.display()} (the storage root "
                    "holds this and other runs)")
        raise _cairn_data_error(what, location.display(), relation)


def _check_not_cairn_data(
    location: StorageLocation, run: StorageLocation, retry: RetryPolicy, *, what: str
) -> None:
    shown = location.display()
    _check_not_holding_run(location, run, what=what)
    for name in (METRICS_DIR, EVENTS_DIR):
        own = run.join(name)
        if own.contains(location):
            raise _cairn_data_error(
                what, shown, f"lies in the run's {name}/ directory, where Cairn keeps the "
                f"run's {'metrics history' if name == METRICS_DIR else 'event log'}")
    first = _first_component_below(run, location) if run.contains(location) else None
    exact = first is not None and (
        _path(location).rstrip("/") == f"{_path(run).rstrip('/')}/{first}")
    relation = "is" if exact else "lies inside"
    if first is not None and exists(run.join(first, MANIFEST_NAME), retry):
        raise _cairn_data_error(
            what, shown, f"{relation} the directory of checkpoint {first!r}, which Cairn "
            "committed and may delete")
    if first is not None and looks_like_default_dir_name(first):
        # Not committed yet, but the name is one Cairn gives its own uploads: a later
        # report's upload would go there, and once this record is forgotten a start's
        # sweep of uploads that never committed would delete it.
        raise _cairn_data_error(
            what, shown, f"{relation} {first!r}, a name Cairn gives the directories of the "
            "checkpoints it uploads (and deletes when one never commits)")
    manifests = sorted(name for name in list_files(location, retry)
                       if name == MANIFEST_NAME or name.endswith("/" + MANIFEST_NAME))
    if manifests:
        raise _cairn_data_error(
            what, shown, f"holds Cairn's checkpoint manifest {manifests[0]!r}: it is, or "
            "contains, a checkpoint Cairn committed")


def _first_component_below(run: StorageLocation, location: StorageLocation) -> str | None:
    """The name of the run-directory entry ``location`` lies in (``run.contains`` holds)."""
    mine, theirs = _path(run).rstrip("/"), _path(location)
    if not theirs.startswith(mine + "/"):
        return None
    return theirs[len(mine) + 1:].split("/")[0]


def _path(location: StorageLocation) -> str:
    root = local_root(location.filesystem)
    if root is None:
        return location.path
    os_path = local_os_join(root, location.path)
    return os.path.realpath(os_path)


def _cairn_data_error(what: str, shown: str, why: str) -> ReportError:
    return ReportError(
        f"{what}: {shown} {why}. A NO_UPLOAD checkpoint is the user's own data, which Cairn "
        "may forget or delete with the checkpoint, so it may not contain Cairn's data. "
        "Write the checkpoint to a directory of its own, outside the run's metrics/, "
        "events/ and checkpoint directories (for example a new directory named after the "
        "report inside the run: cairn.get_context().get_storage()"
        ".build_checkpoint_path_from_name(name))."
    )


def check_upload_source(checkpoint: StorageLocation, run: StorageLocation, *,
                        what: str) -> None:
    """Raise :class:`ReportError` when the checkpoint directory of a SYNC or ASYNC report
    contains the run's storage (it is the run directory or an ancestor of it), on any
    store. The message starts with Ray Train's words for it, "Ray Train's experiment
    directory ... is contained within the checkpoint path".
    """
    if not checkpoint.contains(run):
        return
    source, run_dir = _shown(checkpoint), _shown(run)
    raise ReportError(
        f"Ray Train's experiment directory is contained within the checkpoint path: {what} "
        f"passes {source}, which contains the run directory {run_dir}. Uploading it would "
        "copy the run into itself, and deleting it after the upload would delete the run. "
        "Write the checkpoint to its own directory outside the storage path (for example "
        "tempfile.mkdtemp()) and report that."
    )


def _shown(location: StorageLocation) -> str:
    if local_root(location.filesystem) is None:
        return location.display()
    return repr(_path(location))
