"""Ownership: what a run may delete, decided from what this run recorded.

Every deletion of checkpoint data (retention, reconcile, the cleanup of a failed attempt,
``cairn prune``) asks this module first. The run index alone never decides: on a shared
bucket anyone who can write ``cairn_run.json`` could otherwise make the driver delete any
directory it can reach. The rules:

* **Managed data** (a checkpoint Cairn uploaded) is ``<run>/<dir_name>/``, a direct child
  of the run directory whose name Cairn could have created (a default
  ``checkpoint_000003`` or a name ``report()`` accepts), holding Cairn's manifest whose
  report index is the record's. Nothing else counts as managed, whatever the record's
  ``managed`` flag says.
* **A reference** (a record's ``target_uri`` or ``target_path``: a NO_UPLOAD checkpoint,
  a ``checkpoint_upload_fn`` result) is the user's data. It is deleted only when the user
  asked (``CheckpointConfig(delete_unmanaged_checkpoints=True)`` or
  ``cairn prune --delete-references``), only when this run registered it when it committed
  it (a ``reference_registered`` event in the run's event log), and only when the manifest
  in ``<run>/<dir_name>/`` names the same target.
* **A manifest the index does not name** is adopted (and so may later be deleted) only
  when this run can have written it there: under its report's default name or a name
  the run's event log recorded before its upload began (or registered a reference
  under), and for a report the index does not already name. Anything else is a copy of
  a checkpoint (a user's backup inside the run, manifest included): neither adopted nor
  deleted.
* **A directory without a manifest** is deleted only when it is a direct child with a name
  Cairn could have created, no index record names it, and Cairn created it: a default name
  of a report the run can have made (as far as a new driver can tell, at most one past
  those its logs know of), or an explicit name announced before its upload began.

The functions here are pure: callers read the manifest and the event log and pass what
they found.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cairn._src.checkpoint.index import CheckpointRecord
from cairn._src.checkpoint.manifest import Manifest
from cairn._src.run.events import Event, ReferenceRegistered, as_events
from cairn._src.run.layout import (
    default_checkpoint_dir_name,
    is_default_checkpoint_dir_name,
    is_safe_dir_name,
)

REFERENCE_EVENT = ReferenceRegistered.TYPE

# A reference as recorded: ("uri", target_uri) or ("path", target_path).
Target = tuple[str, str]


def record_target(record: CheckpointRecord) -> Target | None:
    """The reference a record names, or None for a managed checkpoint."""
    if record.target_uri is not None:
        return ("uri", record.target_uri)
    if record.target_path is not None:
        return ("path", record.target_path)
    return None


def manifest_target(manifest: Manifest) -> Target | None:
    if manifest.target_uri is not None:
        return ("uri", manifest.target_uri)
    if manifest.target_path is not None:
        return ("path", manifest.target_path)
    return None


def reference_event(record: CheckpointRecord, *, t: float) -> ReferenceRegistered:
    """The event a commit of a reference emits, so a later deletion may trust it."""
    return ReferenceRegistered(t=t, dir_name=record.dir_name,
                               report_index=record.report_index,
                               target_uri=record.target_uri, target_path=record.target_path)


def registered_references(events: Iterable[Event | Mapping[str, Any]]) -> dict[str, Target]:
    """dir_name -> the reference this run registered under it, from its event log
    (``events``: typed, or records as the log stores them)."""
    registered: dict[str, Target] = {}
    for event in as_events(events):
        if not isinstance(event, ReferenceRegistered) or not isinstance(event.dir_name, str):
            continue
        if event.target_uri is not None:
            registered[event.dir_name] = ("uri", event.target_uri)
        elif event.target_path is not None:
            registered[event.dir_name] = ("path", event.target_path)
    return registered


def could_have_created(dir_name: str) -> bool:
    """Whether Cairn could have created ``<run>/<dir_name>`` for a checkpoint."""
    return is_default_checkpoint_dir_name(dir_name) or is_safe_dir_name(dir_name)


def default_name_report(dir_name: str) -> int | None:
    """The report a default checkpoint name is of (``checkpoint_000003``: 3), or None for
    any other name."""
    if not is_default_checkpoint_dir_name(dir_name):
        return None
    return int(dir_name.partition("_")[2])


def beyond_reports_made(dir_name: str, reports_made: int) -> bool:
    """Whether ``dir_name`` is a default name of a report past the one after
    ``reports_made``, the reports a run's index and logs know of: a report whose upload a
    dead driver can have begun is at most the next one (a directory beyond it was not
    created by this run)."""
    report_index = default_name_report(dir_name)
    return report_index is not None and report_index > reports_made + 1


@dataclass(frozen=True)
class DeletionPlan:
    """What may be deleted of one dropped checkpoint, and why the rest stays."""

    checkpoint_dir: bool
    reference: bool
    refusals: tuple[str, ...] = ()
    # The manifest names a reference inside the checkpoint directory (whatever the index
    # record says): only Cairn's own files there may go, never the user's data.
    keep_contents: bool = False


def plan_deletion(
    record: CheckpointRecord,
    *,
    manifest: Manifest | None,
    registered: Mapping[str, Target],
    delete_references: bool,
) -> DeletionPlan:
    """Which parts of the checkpoint ``record`` names this run may delete.

    ``manifest`` is what ``<run>/<record.dir_name>/`` holds (None when it holds none),
    ``registered`` what :func:`registered_references` found in this run's event log.
    """
    refusals: list[str] = []
    name = record.dir_name
    if not could_have_created(name):
        return DeletionPlan(False, False, (
            f"{name!r} is not a checkpoint directory name Cairn creates; a run deletes "
            "only its own checkpoint directories",))
    if is_default_checkpoint_dir_name(name) and name != default_checkpoint_dir_name(
            record.report_index):
        # Explicit names never look like default ones (report_checks.py): the run never
        # wrote report n anywhere but to report n's default name among these.
        return DeletionPlan(False, False, (
            f"{name} is not the directory this run gives the checkpoint of report "
            f"{record.report_index}; a run deletes only its own checkpoint directories",))
    if manifest is None:
        return DeletionPlan(False, False, (
            f"{name} holds no Cairn manifest, so it is not a checkpoint this run committed",))
    if manifest.report_index != record.report_index:
        return DeletionPlan(False, False, (
            f"the manifest in {name} is of report {manifest.report_index}, the index says "
            f"report {record.report_index}",))
    target = record_target(record)
    delete_reference = False
    if target is not None and delete_references:
        if registered.get(name) != target:
            refusals.append(f"the reference {target[1]} of {name} was not registered by "
                            "this run")
        elif manifest_target(manifest) != target:
            refusals.append(f"the manifest in {name} does not name the reference "
                            f"{target[1]}")
        else:
            delete_reference = True
    return DeletionPlan(True, delete_reference, tuple(refusals))


def may_delete_partial(
    dir_name: str,
    *,
    has_manifest: bool,
    indexed: Collection[str],
    announced: Collection[str],
    holding_references: Collection[str],
) -> bool:
    """Whether ``<run>/<dir_name>``, a directory without a committed checkpoint, is Cairn's
    leftover to delete: an upload that never committed. A new driver judging what a dead
    one left also asks :func:`beyond_reports_made`; the driver that names directories of
    its own reports need not."""
    return (
        not has_manifest
        and could_have_created(dir_name)
        and dir_name not in indexed
        and dir_name not in holding_references
        and (is_default_checkpoint_dir_name(dir_name) or dir_name in announced)
    )
