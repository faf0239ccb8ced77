"""``Checkpoint``: a directory of files on some storage, with Ray Train 2.x's API.

A checkpoint is a reference (a storage location), not data: constructing one touches no
storage. It is *committed* when it has a manifest (:mod:`.manifest`); committed
checkpoints carry their metadata in the manifest and can be verified against it.
Uncommitted ones (a local directory a training loop just wrote) keep metadata in a
``.metadata.json`` file, as Ray Train does. A local copy of a committed checkpoint
(``to_directory``, ``as_directory``) gets the manifest's metadata as that file, so the
metadata travels with the copy, as Ray Train's file does: ``from_directory(copy)`` reads
it and a report of the copy keeps it. The file is never stored as a checkpoint's data:
a report takes it into the manifest.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Collection, Iterator
from dataclasses import replace
from typing import Any

import pyarrow.fs as pafs

from cairn._src.checkpoint.manifest import (
    MANIFEST_NAME,
    Manifest,
    check_json_value,
    read_manifest,
    write_manifest,
)
from cairn._src.checkpoint.verified import verify_local_once
from cairn._src.config.checks import directory_text
from cairn._src.errors import (
    CheckpointNotFoundError,
    ConfigError,
    ManifestError,
    MetadataTypeError,
    NotADirectoryCheckpointError,
)
from cairn._src.run.layout import INDEX_NAME, nearest_marked
from cairn._src.storage.checksum import WrittenFile
from cairn._src.storage.fileio import file_type, read_bytes, write_bytes_atomic
from cairn._src.storage.location import StorageLocation, _known_scheme_set, local_root, resolve
from cairn._src.storage.options import StorageOptions
from cairn._src.storage.retry import RetryPolicy
from cairn._src.storage.scratch import make_directory
from cairn._src.storage.transfer import download_directory, verify_directory
from cairn._src.storage.uris import (
    local_os_join,
    missing_colon_correction,
    public_uri,
    scheme_of,
    typo_correction,
)

logger = logging.getLogger(__name__)

METADATA_FILE_NAME = ".metadata.json"


class Checkpoint:
    """A checkpoint directory on local or remote storage.

    ``path`` is a local path or a URI (see :func:`cairn.storage.resolve`); with
    ``filesystem`` (a ``pyarrow.fs.FileSystem``, an fsspec filesystem, an ``ObjectStore``
    or a zero-argument factory) it is a path inside that filesystem. Checkpoints pickle
    (for workers) and compare equal when they name the same place. Not safe for
    concurrent metadata updates from several processes: the last writer wins.
    """

    def __init__(self, path: str | os.PathLike[str], filesystem: Any = None) -> None:
        if isinstance(path, (str, os.PathLike)):
            text = os.fspath(path)
            if isinstance(text, str):
                _check_storable(text, call="Checkpoint")
        self._location = resolve(path, filesystem)
        # The directory holding the manifest: the checkpoint's own, except for checkpoints
        # registered by reference, whose manifest stays in the run directory.
        self._manifest_location = self._location
        self._committed = False
        self._options = StorageOptions()
        self._retry = self._options.retry
        # What the process that wrote the files computed while writing them (relpath ->
        # WrittenFile): a NO_UPLOAD report hands it to the commit, which takes each entry
        # whose file is unchanged instead of reading the file again. Never pickled.
        self._written: dict[str, WrittenFile] = {}

    @classmethod
    def from_directory(cls, path: str | os.PathLike[str]) -> Checkpoint:
        """A checkpoint of the local directory ``path`` (not copied).

        Raises :class:`ConfigError` for a ``path`` that is not a non-empty ``str`` or
        ``os.PathLike``, or that holds a NUL character or cannot be encoded as UTF-8
        (Cairn stores every path as UTF-8). Does not check that the directory exists.
        """
        return cls(os.path.abspath(_path_text(path, call="Checkpoint.from_directory")))

    @classmethod
    def from_location(cls, location: StorageLocation) -> Checkpoint:
        """A checkpoint at an already resolved :class:`StorageLocation`."""
        checkpoint = cls.__new__(cls)
        checkpoint.__setstate__({"location": location, "manifest_location": location})
        return checkpoint

    @classmethod
    def _from_committed(
        cls, data: StorageLocation, *, manifest_location: StorageLocation
    ) -> Checkpoint:
        """A committed checkpoint whose files are at ``data`` and manifest in
        ``manifest_location`` (a directory; the same place unless registered by reference).
        """
        checkpoint = cls.__new__(cls)
        checkpoint.__setstate__({"location": data, "manifest_location": manifest_location,
                                 "committed": True})
        return checkpoint

    @classmethod
    def _as_written(cls, path: str, written: dict[str, WrittenFile]) -> Checkpoint:
        """The local directory ``path`` with the entries its writer computed (see
        ``cairn.torch.FileSystemWriter.checkpoint``)."""
        checkpoint = cls.from_directory(path)
        checkpoint._written = dict(written)
        return checkpoint

    def _with_options(self, options: StorageOptions) -> Checkpoint:
        """This checkpoint, read and restored with ``options`` (a worker's: its run's
        retry budget, transfer settings and its node's local tier)."""
        checkpoint = Checkpoint.__new__(Checkpoint)
        checkpoint.__setstate__(self.__getstate__())
        checkpoint._options = options
        checkpoint._retry = options.retry
        return checkpoint

    @property
    def path(self) -> str:
        """The path of the directory inside :attr:`filesystem`."""
        return self._location.path

    @property
    def filesystem(self) -> pafs.FileSystem:
        """The ``pyarrow.fs.FileSystem`` holding the directory."""
        return self._location.filesystem

    @property
    def location(self) -> StorageLocation:
        """Where the checkpoint is, as a :class:`StorageLocation`."""
        return self._location

    @property
    def uri(self) -> str | None:
        """A string a new process can resolve to this checkpoint, or ``None`` if none can."""
        return self._location.uri

    def _local_path(self) -> str | None:
        root = local_root(self.filesystem)
        if root is None:
            return None
        return local_os_join(root, self.path)

    def get_manifest(self) -> Manifest | None:
        """The manifest if the checkpoint is committed, else ``None``.

        Raises :class:`ManifestError` for a manifest that cannot be read.
        """
        return read_manifest(self._manifest_location, self._retry)

    def verify(self) -> None:
        """Check every file against the manifest's sizes and checksums.

        Raises :class:`ManifestError` when there is no valid manifest,
        :class:`CheckpointNotFoundError` or :class:`ChecksumMismatchError` naming the bad
        files. Reads all the data.
        """
        manifest = self.get_manifest()
        if manifest is None:
            raise ManifestError(
                f"{self._manifest_location.display()} has no manifest ({MANIFEST_NAME}): it "
                "was never committed (or its upload was interrupted), so it cannot be verified."
            )
        verify_directory(self._location, manifest.files, retry=self._retry,
                         transfer=self._options.transfer)

    def to_directory(self, path: str | os.PathLike[str] | None = None) -> str:
        """Copy the checkpoint's files into the local directory ``path``; return it.

        ``path`` defaults to a new temporary directory; a directory that does not exist is
        created, one that exists (empty or not) is copied into. A committed checkpoint is
        copied as its manifest lists it and every file is verified; the manifest itself is
        not copied, so the directory can be reported as a new checkpoint, and its metadata
        (when it has any) is written as ``.metadata.json``, so that
        ``Checkpoint.from_directory(copy).get_metadata()`` and a report of the copy keep
        it, as with Ray Train's copy. A checkpoint a worker got from ``get_checkpoint()``
        (or its reported checkpoints) in a run with a local tier
        (``CheckpointConfig(local_tier_bytes=...)``) comes from this node's copy when it
        holds all the files, verified the same way (:mod:`.local_tier`).

        Raises :class:`ConfigError`, before anything is read or written, for a ``path``
        that is not a local directory: not a non-empty ``str`` or ``os.PathLike``, a URI
        or a mistyped one (``s3:/bucket``), a NUL character, a name not encodable as
        UTF-8, a file, a directory that cannot be created; and for one that is this
        checkpoint's own directory or inside it, or inside a run directory or a committed
        checkpoint (Cairn's own data, which the copy would change).
        """
        given = None if path is None else self._check_target(path)
        manifest = self.get_manifest()
        if manifest is None:
            self._require_directory()
            self._require_uncommitted()
        if given is None:
            target = tempfile.mkdtemp(prefix="cairn-checkpoint-")
        else:
            text, target = given
            _create_directory(target, text)
        try:
            tier = self._options.local_tier
            if manifest is None or tier is None or not tier.restore(
                    self._manifest_location, manifest, target, self._retry):
                download_directory(
                    self._location,
                    target,
                    files=None if manifest is None else manifest.files,
                    verify=True,
                    retry=self._retry,
                    transfer=self._options.transfer,
                )
            if manifest is not None:
                _write_metadata_file(target, manifest, self._retry)
        except BaseException:
            if path is None:
                shutil.rmtree(target, ignore_errors=True)
            raise
        return target

    def _check_target(self, path: object) -> tuple[str, str]:
        """``path`` as given (a ``str``) and the absolute local directory
        ``to_directory(path)`` may write into, or :class:`ConfigError` saying why ``path``
        is not one (see :meth:`to_directory`)."""
        call = "Checkpoint.to_directory"
        text = _path_text(path, call=call)
        shown = f"{call}(path={public_uri(text)!r})"
        if scheme_of(text) is not None:
            raise ConfigError(
                f"{shown}: path is a URI, but to_directory() copies into a local directory. "
                "Pass a local path; to read the checkpoint on a store, use "
                "Checkpoint(uri).as_directory() or report it to a run on that store.")
        schemes = _known_scheme_set()
        corrected = typo_correction(text, schemes) or missing_colon_correction(
            text.partition("?")[0], schemes)
        if corrected is not None:
            raise ConfigError(
                f"{shown}: path looks like the URI {public_uri(corrected)!r} mistyped, and "
                "to_directory() copies into a local directory, not a store. Pass a local "
                "path; a local directory with that name can be written as './' followed "
                "by it.")
        target = os.path.abspath(text)
        real = os.path.realpath(target)
        own = self._local_path()
        if own is not None:
            own_real = os.path.realpath(own)
            if real == own_real or real.startswith(own_real.rstrip(os.sep) + os.sep):
                raise ConfigError(
                    f"{shown}: path is this checkpoint's own directory {own!r} or inside "
                    "it; copying a checkpoint into itself would mix the copy with its "
                    "files. Pass another directory, or read it in place with "
                    "as_directory().")
        _refuse_cairn_data(real, shown)
        if os.path.lexists(target) and not os.path.isdir(target):
            raise ConfigError(
                f"{shown}: path is a file, not a directory. Pass a directory: an existing "
                "one, empty or not, or one to be created.")
        return text, target

    def _require_uncommitted(self) -> None:
        """Raise when this checkpoint was handed out as committed and its manifest is gone
        (retention or ``cairn prune`` deletes the manifest first, then the data): what is
        left there may be part of it, never to be restored as if whole."""
        if self._committed:
            raise CheckpointNotFoundError(
                f"The manifest of checkpoint {self._manifest_location.display()} is gone, "
                "though it was committed: it was deleted after it committed (by retention "
                "or `cairn prune`), or storage lost it. Its files are not restored; use a "
                "checkpoint the run still holds (Result.from_path(...).best_checkpoints).")

    def _require_directory(self) -> None:
        kind = file_type(self._location, self._retry)
        if kind == pafs.FileType.NotFound:
            raise CheckpointNotFoundError(
                f"Checkpoint directory {self._location.display()} does not exist; pass the "
                "location of an existing checkpoint directory."
            )
        if kind == pafs.FileType.File:
            raise NotADirectoryCheckpointError(
                f"Checkpoint path {self._location.display()} is a file, not a directory; "
                "a checkpoint is a directory of files."
            )

    @contextlib.contextmanager
    def as_directory(self) -> Iterator[str]:
        """A local directory with the checkpoint's files, for the ``with`` block.

        A local checkpoint yields its own path (no copy: do not modify it); when it is
        committed, every file is first verified against the manifest, once per process
        (see :mod:`.verified`: a later call re-reads only when a file's size, modification
        time or inode changed). A remote one is downloaded (and verified when committed)
        to a temporary directory that is deleted when the block exits; so is a checkpoint
        that a rank kept after a failure (``keep_survivors``) restores from its own or a
        peer's memory copy (verified against the manifest). Such a copy holds the
        checkpoint's metadata as ``.metadata.json``, as :meth:`to_directory` writes it; a
        local committed one yields its own directory, whose manifest holds the metadata
        that ``from_directory`` reads. Damage raises a
        :class:`~cairn._src.errors.CheckpointDamagedError` before the block runs.
        """
        local = self._local_path()
        restored = self._restore_from_copies() if local is not None else None
        if restored is not None:
            try:
                yield restored
            finally:
                shutil.rmtree(restored, ignore_errors=True)
            return
        if local is not None:
            if not os.path.exists(local):
                raise CheckpointNotFoundError(
                    f"Checkpoint directory {local!r} does not exist."
                )
            if not os.path.isdir(local):
                raise NotADirectoryCheckpointError(
                    f"Checkpoint path {local!r} is a file, not a directory."
                )
            self._verify_local_once(local)
            yield local
            return
        # Named after this process, so that a sweep removes it when the process is killed
        # inside the block (an OOM kill while the model loads), as restore directories are.
        target = make_directory(None)
        try:
            self.to_directory(target)
            yield target
        finally:
            shutil.rmtree(target, ignore_errors=True)

    def _verified_objects(self, names: list[str],
                          shared: Collection[str] = ()) -> dict[str, Any] | None:
        """The files ``names`` of this committed checkpoint as objects (deserialized, not
        read from anywhere) from a kept rank's own memory copy, each checked against the
        manifest's checksum; None unless the copy holds all of them verified. The objects
        of ``shared`` are the held ones, not copies: the caller must only read them."""
        copies = self._options.local_tier
        objects = getattr(copies, "verified_objects", None)
        if objects is None:
            return None
        manifest = self.get_manifest()
        if manifest is None:
            return None
        held = objects(self._manifest_location, manifest, names, shared)
        return dict(held) if held is not None else None

    def _restore_from_copies(self) -> str | None:
        """A committed checkpoint on a local path, restored into a temporary directory
        from the worker's copies of it (a kept rank's memory, a peer's: see
        ``cairn._src.worker.memory_copy``); None where they do not hold it."""
        copies = self._options.local_tier
        if copies is None:
            return None
        manifest = self.get_manifest()
        if manifest is None:
            return None
        # Into memory (a RAM file system) where the copies say it fits.
        scratch = getattr(copies, "scratch_directory", None)
        target = make_directory(scratch(sum(e.size for e in manifest.files.values()))
                                if scratch else None)
        try:
            if copies.restore(self._manifest_location, manifest, target, self._retry):
                _write_metadata_file(target, manifest, self._retry)
                return target
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise
        shutil.rmtree(target, ignore_errors=True)
        return None

    def _verify_local_once(self, local: str) -> None:
        where = self._manifest_location.join(MANIFEST_NAME)
        try:
            data = read_bytes(where, self._retry)
        except CheckpointNotFoundError:
            self._require_uncommitted()
            return  # Not committed: a directory a training loop wrote, nothing to check.
        manifest = Manifest.from_json(data, where=where.display())
        names = sorted(manifest.files)
        verify_local_once(
            manifest_where=where.display(),
            manifest_bytes=data,
            data_root=local,
            names=names,
            verify=lambda: verify_directory(self._location, manifest.files, retry=self._retry,
                                            transfer=self._options.transfer),
        )

    def get_metadata(self) -> dict[str, Any]:
        """The user metadata: from the manifest when committed, else ``.metadata.json``."""
        manifest = self.get_manifest()
        if manifest is not None:
            return dict(manifest.metadata)
        try:
            data = read_bytes(self._location.join(METADATA_FILE_NAME), self._retry)
        except CheckpointNotFoundError:
            return {}
        try:
            value = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise ManifestError(
                f"{self._location.join(METADATA_FILE_NAME).display()} is not valid JSON "
                f"({exc}); rewrite it with set_metadata()."
            ) from exc
        if not isinstance(value, dict):
            raise ManifestError(
                f"{self._location.join(METADATA_FILE_NAME).display()} holds a JSON "
                f"{type(value).__name__}, not an object; rewrite it with set_metadata()."
            )
        return value

    def set_metadata(self, metadata: dict[str, Any]) -> None:
        """Replace the metadata. ``metadata`` must be a JSON-serializable dict.

        On a committed checkpoint the manifest is rewritten atomically. Raises
        :class:`MetadataTypeError` (a ``ConfigError`` and a ``TypeError``, as Ray Train
        raises) for metadata that is not a dict with str keys that JSON can encode.
        """
        check_json_value(metadata, argument="metadata", error=MetadataTypeError)
        self._write_metadata(dict(metadata))

    def update_metadata(self, metadata: dict[str, Any]) -> None:
        """Merge ``metadata`` into the existing metadata (its keys win); raises as
        :meth:`set_metadata` does."""
        check_json_value(metadata, argument="metadata", error=MetadataTypeError)
        merged = self.get_metadata()
        merged.update(metadata)
        self._write_metadata(merged)

    def _write_metadata(self, metadata: dict[str, Any]) -> None:
        manifest = self.get_manifest()
        if manifest is not None:
            write_manifest(
                self._manifest_location, replace(manifest, metadata=metadata), self._retry
            )
            return
        self._require_directory()
        write_bytes_atomic(self._location.join(METADATA_FILE_NAME), _metadata_bytes(metadata),
                           self._retry)

    def _key(self) -> tuple[str, str]:
        if self.uri is not None:
            return ("uri", self.uri)
        return (self.filesystem.type_name, self.path)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Checkpoint):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        # Ray Train's form, plus the URI (credentials redacted) where the filesystem type
        # alone does not say which store it is.
        location = self._location
        text = f"Checkpoint(filesystem={location.filesystem.type_name}, path={location.path}"
        if location.uri is not None and location.uri != location.path:
            text += f", uri={location.display()!r}"
        return text + ")"

    def __getstate__(self) -> dict[str, Any]:
        return {"location": self._location, "manifest_location": self._manifest_location,
                "committed": self._committed}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._location = state["location"]
        self._manifest_location = state.get("manifest_location", self._location)
        # Handed out as committed (get_checkpoint, Result, reported checkpoints): a missing
        # manifest is then a deletion or a loss, not a directory never committed.
        self._committed = state.get("committed", False) is True
        self._options = StorageOptions()
        self._retry = self._options.retry
        self._written = {}


def _metadata_bytes(metadata: dict[str, Any]) -> bytes:
    return json.dumps(metadata, sort_keys=True).encode("utf-8")


def _write_metadata_file(target: str, manifest: Manifest, retry: RetryPolicy) -> None:
    """Write ``manifest``'s metadata, when it has any, as ``.metadata.json`` in the local
    directory ``target`` that a committed checkpoint was just copied into: the copy is an
    uncommitted checkpoint, whose metadata lives in that file (replaced atomically)."""
    if manifest.metadata:
        write_bytes_atomic(resolve(os.path.join(target, METADATA_FILE_NAME)),
                           _metadata_bytes(dict(manifest.metadata)), retry)


def _path_text(path: object, *, call: str) -> str:
    """``path`` as a ``str``, or :class:`ConfigError` naming ``call``'s ``path`` when it
    is not a non-empty ``str`` or ``os.PathLike`` of one, or cannot be stored."""
    text = directory_text(path, shown=f"{call}(path={path!r})")
    _check_storable(text, call=call)
    return text


def _check_storable(text: str, *, call: str) -> None:
    """Raise :class:`ConfigError` when ``text`` holds a NUL character (no file system or
    store takes one) or cannot be encoded as UTF-8 (a name with bytes that Python
    decoded to surrogates), which storage calls would otherwise fail on deep inside a
    report or a copy. The path is shown with such characters escaped."""
    shown = f"{call}(path={public_uri(text)!r})"
    if "\0" in text:
        raise ConfigError(
            f"{shown}: path contains a NUL character, which no file system or store "
            "accepts in a name. Pass the directory's path without it.")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(
            f"{shown}: path cannot be encoded as UTF-8 (it holds bytes that are not "
            "UTF-8, shown as \\udcXX), and Cairn stores every path as UTF-8. Rename the "
            "directory, or copy the checkpoint into one whose path is UTF-8.") from None


def _refuse_cairn_data(real: str, shown: str) -> None:
    """Raise :class:`ConfigError` when the local directory ``real`` (resolved, existing
    or not) is, or lies inside, a run directory (it holds the run index) or a committed
    checkpoint (it holds a manifest): Cairn's own data, which a copy there would change."""
    found = nearest_marked(real, (INDEX_NAME, MANIFEST_NAME))
    if found is None:
        return
    directory, name = found
    if name == INDEX_NAME:
        raise ConfigError(
            f"{shown}: path is the run directory {directory!r} or inside it (it holds "
            f"the run index {INDEX_NAME}): Cairn's own data, which a copy there would "
            "change. Pass a directory outside the run.")
    raise ConfigError(
        f"{shown}: path is the committed checkpoint {directory!r} or inside it "
        f"(it holds the manifest {MANIFEST_NAME}), and a committed checkpoint is "
        "never changed. Pass a directory outside it.")


def _create_directory(target: str, path: str) -> None:
    """Create the local directory ``target`` (and its parents) when missing, or raise
    :class:`ConfigError` naming ``to_directory``'s ``path`` and the system's reason."""
    try:
        os.makedirs(target, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"Checkpoint.to_directory(path={path!r}): the directory {target!r} "
            f"cannot be created ({exc.strerror or exc}). Pass a directory that exists or "
            "can be created.") from exc
