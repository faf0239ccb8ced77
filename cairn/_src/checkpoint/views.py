"""What the controller knows of a checkpoint, as the checkpoint manager takes and gives it.

:class:`ReadyCheckpoint`: every rank uploaded (or referenced) its part; the manager commits
it. :class:`CheckpointView`: a committed checkpoint, as the controller sends it to workers
and callbacks; :func:`checkpoint_from_view` turns it into the user's :class:`Checkpoint`.
:class:`ReferencedCheckpoint`: a committed checkpoint whose data a URI names, resolved when
first used (``Result`` hands these out).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cairn._src.checkpoint.checkpoint import Checkpoint
from cairn._src.errors import CairnError
from cairn._src.storage.checksum import WrittenFile
from cairn._src.storage.location import StorageLocation, resolve
from cairn._src.storage.options import StorageOptions
from cairn._src.storage.transfer import FileEntry
from cairn._src.storage.uris import redact


def checkpoint_from_view(view: CheckpointView,
                         options: StorageOptions | None = None) -> Checkpoint:
    """A checkpoint that reads its data from ``view.data`` and verifies it against the
    manifest at ``view.manifest_at`` (the same place, unless registered by reference);
    with ``options`` (the run's), read and restored with its transfer settings and retry
    budget."""
    checkpoint = Checkpoint._from_committed(view.data, manifest_location=view.manifest_at)
    return checkpoint if options is None else checkpoint._with_options(options)


class ReferencedCheckpoint(Checkpoint):
    """A committed checkpoint registered by reference to ``uri`` (a NO_UPLOAD report, a
    ``checkpoint_upload_fn``'s result), its manifest in ``manifest_location``.

    ``uri`` is resolved when the checkpoint is first used (:attr:`path`,
    :attr:`filesystem`, :attr:`location`, reading or restoring it), not when it is made:
    a run reads back (``Result.from_path``) in a process that may not resolve its
    references (a scheme its training script registered in code; an ``s3://`` URI
    without a region asks S3 for one). A reference that does not resolve fails there,
    with the resolver's error (:class:`~cairn.UnknownSchemeError` names the scheme and
    how to register it); :attr:`uri`, equality and pickling never resolve it, and
    ``repr`` shows the URI alone where it does not resolve.
    """

    def __init__(self, uri: str, manifest_location: StorageLocation) -> None:
        # The state of a committed checkpoint, less its location: __getattr__ resolves that
        # on first use.
        self.__setstate__({"location": manifest_location,
                           "manifest_location": manifest_location, "committed": True})
        del self._location
        self._reference_uri = uri

    def __getattr__(self, name: str) -> StorageLocation:
        if name != "_location":
            raise AttributeError(name)
        self._location = resolve(self._reference_uri)
        return self._location

    @property
    def uri(self) -> str:
        return self._reference_uri

    def __repr__(self) -> str:
        try:
            return super().__repr__()
        except CairnError:
            return f"Checkpoint(uri={redact(self._reference_uri)!r})"

    def __reduce__(self) -> tuple[type[ReferencedCheckpoint], tuple[str, StorageLocation]]:
        return (ReferencedCheckpoint, (self._reference_uri, self._manifest_location))


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
