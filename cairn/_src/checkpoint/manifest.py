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
import time
from dataclasses import dataclass, field
from typing import Any

from cairn._src.errors import CheckpointNotFoundError, ConfigError, ManifestError, UnsafePathError
from cairn._src.storage.checksum import CHECKSUM_ALGORITHM, FileEntry
from cairn._src.storage.fileio import read_bytes, write_bytes_atomic
from cairn._src.storage.location import StorageLocation
from cairn._src.storage.paths import check_absolute_path, check_relative_path
from cairn._src.storage.retry import DEFAULT_RETRY, RetryPolicy

logger = logging.getLogger(__name__)

MANIFEST_NAME = "_cairn_manifest.json"
MANIFEST_VERSION = 1
_READABLE_VERSIONS = (1,)


def check_json_value(value: Any, *, argument: str, error: type[Exception] = ConfigError) -> None:
    """Raise ``error`` unless ``value`` is a dict with str keys that JSON can encode.

    NaN and infinities are accepted (metrics such as a diverged loss are legitimate), as
    Python's json module reads them back.
    """
    if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
        raise error(
            f"{argument}={value!r} must be a dict with str keys, got "
            f"{type(value).__name__}."
        )
    try:
        json.dumps(value)
    except (TypeError, ValueError) as exc:
        raise error(
            f"{argument} must be JSON-serializable (str, int, float, bool, None, lists and "
            f"dicts with str keys): {exc}. Convert the value first, for example "
            "tensor.item() or str(path)."
        ) from exc


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
                f"Manifest.files={self.files!r} must be a dict of relative path -> FileEntry."
            )
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
        check_json_value(self.metadata, argument="Manifest.metadata")
        check_json_value(self.metrics, argument="Manifest.metrics")
        if self.report_index is not None and (
            isinstance(self.report_index, bool)
            or not isinstance(self.report_index, int)
            or self.report_index < 0
        ):
            raise ConfigError(
                f"Manifest.report_index={self.report_index!r} must be None or an int >= 0."
            )
        if not isinstance(self.ranks, tuple) or not all(
            isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0
            for rank in self.ranks
        ):
            raise ConfigError(
                f"Manifest.ranks={self.ranks!r} must be a tuple of ints >= 0."
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

        Raises :class:`ManifestError` for invalid JSON, an unknown version or a bad field.
        """
        try:
            document = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise ManifestError(
                f"The manifest {where} is not valid JSON ({exc}); the checkpoint is "
                "damaged. Delete it or restore the manifest from a backup."
            ) from exc
        if not isinstance(document, dict):
            raise ManifestError(
                f"The manifest {where} holds a JSON {type(document).__name__}, not an "
                "object; the checkpoint is damaged."
            )
        version = document.get("version")
        if version not in _READABLE_VERSIONS:
            readable = ", ".join(str(v) for v in _READABLE_VERSIONS)
            raise ManifestError(
                f"The manifest {where} has version {version!r}; this Cairn reads versions "
                f"{readable}. Upgrade Cairn to read checkpoints written by a newer one."
            )
        try:
            files = {
                rel: _file_entry(raw, rel) for rel, raw in _field(document, "files", dict).items()
            }
            return cls(
                files=files,
                metadata=_field(document, "metadata", dict, {}),
                report_index=_field(document, "report_index", (int, type(None)), None),
                metrics=_field(document, "metrics", dict, {}),
                ranks=tuple(_field(document, "ranks", list, [])),
                target_uri=_field(document, "target_uri", (str, type(None)), None),
                target_path=_field(document, "target_path", (str, type(None)), None),
                created_at=float(_field(document, "created_at", (int, float))),
                checksum_algorithm=_field(document, "checksum_algorithm", str),
                version=version,
            )
        except (ConfigError, UnsafePathError, KeyError, TypeError) as exc:
            raise ManifestError(f"The manifest {where} is invalid: {exc}") from exc


_MISSING = object()


def _field(document: dict[str, Any], name: str, kind: Any, default: Any = _MISSING) -> Any:
    value = document.get(name, default)
    if value is _MISSING:
        raise KeyError(f"field {name!r} is missing")
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise TypeError(f"field {name!r} is {value!r}, of the wrong type")
    return value


def _file_entry(raw: Any, rel: str) -> FileEntry:
    if (
        not isinstance(raw, dict)
        or not isinstance(raw.get("size"), int)
        or isinstance(raw.get("size"), bool)
        or raw["size"] < 0
        or not isinstance(raw.get("checksum"), str)
    ):
        raise TypeError(f"files[{rel!r}]={raw!r} must be {{'size': int >= 0, 'checksum': str}}")
    return FileEntry(size=raw["size"], checksum=raw["checksum"])


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
    checkpoint_dir: StorageLocation, manifest: Manifest, retry: RetryPolicy = DEFAULT_RETRY
) -> None:
    """Write ``manifest`` atomically into ``checkpoint_dir``: this commits the checkpoint.

    Call it only after every file the manifest lists is on storage.
    """
    write_bytes_atomic(checkpoint_dir.join(MANIFEST_NAME), manifest.to_json(), retry)
    logger.debug(
        "Wrote manifest of %s (%d files, %d bytes)",
        checkpoint_dir.display(), len(manifest.files), manifest.total_bytes,
    )
