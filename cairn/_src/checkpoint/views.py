"""What the controller knows of a checkpoint, as the checkpoint manager takes and gives it.

:class:`ReadyCheckpoint`: every rank uploaded (or referenced) its part; the manager commits
it. :class:`CheckpointView`: a committed checkpoint, as the controller sends it to workers
and callbacks; :func:`checkpoint_from_view` turns it into the user's :class:`Checkpoint`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cairn._src.checkpoint.checkpoint import Checkpoint
from cairn._src.storage.checksum import WrittenFile
from cairn._src.storage.location import StorageLocation
from cairn._src.storage.options import StorageOptions
from cairn._src.storage.transfer import FileEntry


def checkpoint_from_view(view: CheckpointView,
                         options: StorageOptions | None = None) -> Checkpoint:
    """A checkpoint that reads its data from ``view.data`` and verifies it against the
    manifest at ``view.manifest_at`` (the same place, unless registered by reference);
    with ``options`` (the run's), read and restored with its transfer settings and retry
    budget."""
    checkpoint = Checkpoint._from_committed(view.data, manifest_location=view.manifest_at)
    return checkpoint if options is None else checkpoint._with_options(options)


@dataclass(frozen=True)
class CheckpointView:
    """A committed checkpoint, as sent to workers."""

    dir_name: str
    report_index: int
    data: StorageLocation
    manifest_at: StorageLocation
    metrics: dict[str, Any]


@dataclass(frozen=True)
class ReadyCheckpoint:
    """Everything the checkpoint manager needs to commit one report's checkpoint."""

    index: int
    dir_name: str
    metrics: dict[str, object]
    entries: dict[str, FileEntry]
    ranks: tuple[int, ...]
    reference: StorageLocation | None
    metadata: dict[str, object]
    bytes_uploaded: int
    # The validation task asked for by the lowest rank that asked for one, or None.
    validation: dict[str, object] | None = None
    # Of a reference: the entries its ranks' writers computed while writing (relpath in
    # the reference -> WrittenFile), taken where the file is unchanged (storage/written.py).
    written: dict[str, WrittenFile] = field(default_factory=dict)
