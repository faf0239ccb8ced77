"""The checkpoint manifest: the list of a checkpoint's files, and its commit marker.

A checkpoint directory is committed once ``_cairn_manifest.json`` exists in it. Writers
upload every data file first and the manifest last, atomically; a directory without a
manifest is an interrupted write, never a checkpoint. The manifest records each file's
size and checksum, so that readers can verify what they restore, plus the report's index,
metrics, user metadata and contributing ranks.

Format (``version`` 1), UTF-8 JSON::

    {"version": 1, "checksum_algorithm": "xxh3_128", "created_at": 1700000000.0,
     "report_index": 3, "ranks": [0, 1], "metrics": {...}, "metadata": {...},
     "target_uri": null, "target_path": null,
     "files": {"model/weights.pt": {"size": 123, "checksum": "<32 hex digits>"}}}
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from cairn._src.errors import CheckpointNotFoundError, ConfigError, ManifestError, UnsafePathError
from cairn._src.run import layout, schema
from cairn._src.storage.checksum import ALGORITHMS, CHECKSUM_ALGORITHM, FileEntry
from cairn._src.storage.fileio import read_bytes, write_bytes_atomic
from cairn._src.storage.location import StorageLocation
from cairn._src.storage.paths import (
    are_normal_relative_paths,
    check_absolute_path,
    check_relative_path,
)
from cairn._src.storage.retry import DEFAULT_RETRY, RetryPolicy
from cairn._src.text import plural

logger = logging.getLogger(__name__)

MANIFEST_NAME = layout.MANIFEST_NAME
MANIFEST_VERSION = 1
_READABLE_VERSIONS = (1,)
_HINT = "The checkpoint is damaged; delete it or restore the manifest from a backup."

# Checksums joined by "\n": each 32 lowercase hex digits.
_CHECKSUMS = re.compile(r"[0-9a-f]{32}(?:\n[0-9a-f]{32})*")

_FILE_ENTRY = schema.Object(
    {"size": schema.COUNT, "checksum": schema.CHECKSUM},
    required=frozenset({"size", "checksum"}),
    noun="{'size': int >= 0, 'checksum': 32 hex digits}",
)
MANIFEST_SCHEMA = schema.Document(
    "manifest",
    schema.Object(
        {
            "version": schema.Integer(),
            "checksum_algorithm": schema.String(
                expected=f"one of {', '.join(sorted(ALGORITHMS))}",
                test=ALGORITHMS.__contains__,
            ),
            "created_at": schema.TIME,
            "report_index": schema.Nullable(schema.REPORT_INDEX),
            "ranks": schema.ListOf(schema.COUNT, noun="ranks (integers >= 0)"),
            "target_uri": schema.Nullable(schema.URI),
            "target_path": schema.Nullable(schema.ABSOLUTE_PATH),
            "metrics": schema.USER_JSON,
            "metadata": schema.USER_JSON,
            "files": schema.MapOf(schema.RELATIVE_PATH, _FILE_ENTRY,
                                  noun="relative path -> {'size', 'checksum'}"),
        },
        required=frozenset({"files", "created_at", "checksum_algorithm"}),
        noun="a JSON object",
    ),
    hint=_HINT,
)


def check_json_value(
    value: Any,
    *,
    argument: str,
    error: type[Exception] = ConfigError,
    max_depth: int = schema.MAX_USER_DEPTH,
) -> None:
    """Raise ``error`` unless ``value`` is a dict with str keys that JSON can encode.

    NaN and infinities are accepted (metrics such as a diverged loss are legitimate), as
    Python's json module reads them back. Nesting deeper than ``max_depth`` levels is
    refused (measured without recursion), so a RecursionError never escapes.
    """
    if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
        raise error(
            f"{argument}={_short(value)} must be a dict with str keys, got "
            f"{type(value).__name__}."
        )
    if schema.nesting_depth(value, max_depth) > max_depth:
        raise error(
            f"{argument} is nested more than {max_depth} levels deep; flatten it (for "
            "example 'a/b/c' keys instead of nested dicts)."
        )
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise error(
            f"{argument} must be JSON-serializable (str, int, float, bool, None, lists and "
            f"dicts with str keys): {exc}. Convert the value first, for example "
            "tensor.item() or str(path)."
        ) from exc


def _short(value: object, limit: int = 80) -> str:
    try:
        text = repr(value)
    except RecursionError:
        return f"<a deeply nested {type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_no_file_under_file(names: Iterable[str], *, argument: str) -> None:
    """Raise :class:`UnsafePathError` when one name is a parent directory of another.

    ``x`` and ``x/y`` cannot both be files: restoring one would fail on the other. Linear
    in the total length of the names.
    """
    files = set(names)
    # Most names share few directories: look for a file among those directories and their
    # ancestors first (100,000 names in 1,000 directories: 1,000 walks, not 100,000).
    directories = {rel.rpartition("/")[0] for rel in files}
    ancestors: set[str] = set()
    for directory in directories:
        while directory and directory not in ancestors:
            ancestors.add(directory)
            directory = directory.rpartition("/")[0]
    if files.isdisjoint(ancestors):
        return
    for rel in files:
        cut = rel.rfind("/")
        while cut > 0:
            parent = rel[:cut]
            if parent in files:
                raise UnsafePathError(
                    f"{argument} lists both {parent!r} and {rel!r}: {parent!r} cannot be a "
                    "file and a directory at once."
                )
            cut = rel.rfind("/", 0, cut)


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """What a committed checkpoint contains. Immutable; validated on construction."""

    files: dict[str, FileEntry]
    metadata: dict[str, Any] = field(default_factory=dict)
    report_index: int | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    ranks: tuple[int, ...] = ()
    # Where the data is when it is not next to the manifest (a checkpoint registered by
    # reference): a URI that resolve() maps back to it. None: the manifest's directory.
    target_uri: str | None = None
    # A reference on the run's own storage filesystem object (which may have no URI): the
    # absolute path of its data on that filesystem. At most one of the two is set.
    target_path: str | None = None
    created_at: float = field(default_factory=time.time)
    checksum_algorithm: str = CHECKSUM_ALGORITHM
    version: int = MANIFEST_VERSION

    def __post_init__(self) -> None:
        if not isinstance(self.files, dict):
            raise ConfigError(
                f"Manifest.files={_short(self.files)} must be a dict of relative path -> "
                "FileEntry."
            )
        # All entries at once when they are plain: a dict of str keys (a subclass could
        # iterate or hash other than it compares), each a normal path to a FileEntry.
        if not (type(self.files) is dict and all(type(rel) is str for rel in self.files)
                and are_normal_relative_paths(self.files) and MANIFEST_NAME not in self.files
                and all(isinstance(entry, FileEntry) for entry in self.files.values())):
            self._check_each_file()  # Names the entry that is wrong.
        check_no_file_under_file(self.files, argument="Manifest.files")
        # Values read back may be nested deeper than users may report now (older data).
        check_json_value(self.metadata, argument="Manifest.metadata",
                         max_depth=schema.MAX_STORED_DEPTH)
        check_json_value(self.metrics, argument="Manifest.metrics",
                         max_depth=schema.MAX_STORED_DEPTH)
        if self.report_index is not None and (
            isinstance(self.report_index, bool)
            or not isinstance(self.report_index, int)
            or not 0 <= self.report_index <= schema.MAX_REPORT_INDEX
        ):
            raise ConfigError(
                f"Manifest.report_index={self.report_index!r} must be None or an int from 0 "
                f"to {schema.MAX_REPORT_INDEX}."
            )
        if not isinstance(self.ranks, tuple) or not all(
            isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0
            for rank in self.ranks
        ):
            raise ConfigError(
                f"Manifest.ranks={_short(self.ranks)} must be a tuple of ints >= 0."
            )
        if self.target_uri is not None and (
            not isinstance(self.target_uri, str) or not self.target_uri
        ):
            raise ConfigError(
                f"Manifest.target_uri={self.target_uri!r} must be None or a non-empty URI "
                "string."
            )
        if self.target_path is not None:
            check_absolute_path(self.target_path, argument="Manifest.target_path")
            if self.target_uri is not None:
                raise ConfigError(
                    f"Manifest.target_uri={self.target_uri!r} and Manifest.target_path="
                    f"{self.target_path!r} are both set; a reference has one location."
                )
        if not isinstance(self.created_at, (int, float)) or not math.isfinite(self.created_at):
            raise ConfigError(
                f"Manifest.created_at={self.created_at!r} must be a finite number of seconds."
            )

    def _check_each_file(self) -> None:
        """Raise for the first entry of ``files`` that is not a normal relative path to a
        :class:`FileEntry` other than the manifest itself."""
        for rel, entry in self.files.items():
            if check_relative_path(rel, argument="Manifest.files key") != rel:
                raise UnsafePathError(
                    f"Manifest.files key {rel!r} is not in normal form; use "
                    f"{check_relative_path(rel)!r}."
                )
            if rel == MANIFEST_NAME:
                raise ConfigError(
                    f"Manifest.files must not list the manifest itself ({MANIFEST_NAME!r})."
                )
            if not isinstance(entry, FileEntry):
                raise ConfigError(
                    f"Manifest.files[{rel!r}]={entry!r} must be a FileEntry(size, checksum)."
                )

    @property
    def total_bytes(self) -> int:
        """Sum of the sizes of all files."""
        return sum(entry.size for entry in self.files.values())

    def to_json(self) -> bytes:
        """The manifest as UTF-8 JSON, keys sorted (stable bytes for equal manifests)."""
        document = {
            "version": self.version,
            "checksum_algorithm": self.checksum_algorithm,
            "created_at": self.created_at,
            "report_index": self.report_index,
            "ranks": list(self.ranks),
            "target_uri": self.target_uri,
            "target_path": self.target_path,
            "metrics": self.metrics,
            "metadata": self.metadata,
            "files": {
                rel: {"size": entry.size, "checksum": entry.checksum}
                for rel, entry in sorted(self.files.items())
            },
        }
        return json.dumps(document, sort_keys=True, separators=(",", ":")).encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes, *, where: str) -> Manifest:
        """Parse a manifest; ``where`` (a redacted location) names it in errors.

        Raises :class:`ManifestError` for invalid JSON (nested too deeply included), an
        unknown version, or a field that does not match the manifest's schema; the
        message names the field and what it should be.
        """
        document = schema.load_json(data, what="manifest", where=where, hint=_HINT)
        if not isinstance(document, dict):
            raise ManifestError(
                f"The manifest {where} holds a JSON {type(document).__name__}, not an "
                "object; the checkpoint is damaged."
            )
        version = document.get("version")
        if type(version) is not int or version not in _READABLE_VERSIONS:
            readable = ", ".join(str(v) for v in _READABLE_VERSIONS)
            raise ManifestError(
                f"The manifest {where} has version {_short(version)}; this Cairn reads "
                f"versions {readable}. Upgrade Cairn to read checkpoints written by a newer one."
            )
        files = _file_entries(document.get("files"))
        if files is None:
            # Something in the files is not as Cairn writes it: the schema names it.
            schema.validate(document, MANIFEST_SCHEMA, where=where)
            files = {rel: FileEntry(size=raw["size"], checksum=raw["checksum"])
                     for rel, raw in document["files"].items()}
        else:
            schema.validate({**document, "files": {}}, MANIFEST_SCHEMA, where=where)
        try:
            return cls(
                files=files,
                metadata=document.get("metadata") or {},
                report_index=document.get("report_index"),
                metrics=document.get("metrics") or {},
                ranks=tuple(document.get("ranks") or ()),
                target_uri=document.get("target_uri"),
                target_path=document.get("target_path"),
                created_at=float(document["created_at"]),
                checksum_algorithm=document["checksum_algorithm"],
                version=version,
            )
        except (ConfigError, UnsafePathError) as exc:
            raise ManifestError(f"The manifest {where} is invalid: {exc} {_HINT}") from exc


def _file_entries(raw: object) -> dict[str, FileEntry] | None:
    """The ``files`` of a manifest document as entries when every one is as the schema
    wants it (a path in normal form -> ``{"size": int >= 0, "checksum": 32 lowercase hex
    digits}``), else None. The same rules as ``MANIFEST_SCHEMA``'s, each checked over all
    entries at once: the checksums by one match of them joined, the paths by
    :func:`are_normal_relative_paths`."""
    if type(raw) is not dict:
        return None
    entries: dict[str, FileEntry] = {}
    for rel, item in raw.items():
        if type(item) is not dict:
            return None
        size, checksum = item.get("size"), item.get("checksum")
        if type(size) is not int or size < 0 or type(checksum) is not str:
            return None
        entries[rel] = FileEntry(size, checksum)
    checksums = "\n".join(entry.checksum for entry in entries.values())
    # As many blocks of 32 as entries: no checksum holds a newline of its own.
    if entries and (len(checksums) != 33 * len(entries) - 1
                    or _CHECKSUMS.fullmatch(checksums) is None):
        return None
    return entries if are_normal_relative_paths(entries) else None


def read_manifest(
    checkpoint_dir: StorageLocation, retry: RetryPolicy = DEFAULT_RETRY
) -> Manifest | None:
    """The manifest of the checkpoint at ``checkpoint_dir``; ``None`` if uncommitted.

    Raises :class:`ManifestError` when a manifest exists but cannot be read as one.
    """
    loc = checkpoint_dir.join(MANIFEST_NAME)
    try:
        data = read_bytes(loc, retry)
    except CheckpointNotFoundError:
        return None
    return Manifest.from_json(data, where=loc.display())


def write_manifest(
    checkpoint_dir: StorageLocation, manifest: Manifest, retry: RetryPolicy = DEFAULT_RETRY,
    *, durable: bool = True,
) -> None:
    """Write ``manifest`` atomically into ``checkpoint_dir``: this commits the checkpoint.

    Call it only after every file the manifest lists is on storage (and, with
    ``durable``, fsynced: :func:`~cairn._src.storage.durability.sync_uploaded`).
    ``durable`` (``RunConfig.storage_fsync``): on storage with an OS path the manifest is
    fsynced under a temporary name, renamed, and its directory fsynced.
    """
    write_bytes_atomic(checkpoint_dir.join(MANIFEST_NAME), manifest.to_json(), retry,
                       durable=durable)
    logger.debug(
        "Wrote manifest of %s (%s, %d bytes)",
        checkpoint_dir.display(), plural(len(manifest.files), "file"), manifest.total_bytes,
    )
