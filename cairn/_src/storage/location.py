"""Storage locations: a ``pyarrow.fs.FileSystem``, a path in it, and how to reach it again.

:func:`resolve` turns what users pass (a local path, a URI, a filesystem object or a
factory) into a :class:`StorageLocation`. Internally every backend is a
``pyarrow.fs.FileSystem``; fsspec filesystems and custom object stores are adapted.

Resolution order for a URI ``<scheme>://...``: a scheme registered in code or by an entry
point, then pyarrow's native backends (``s3``, ``gs``/``gcs``, ``hdfs``, ``viewfs``),
then any fsspec protocol. ``file://`` URIs and plain paths are the local file system.
"""

from __future__ import annotations

import logging
import os
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.fs as pafs
from fsspec.registry import known_implementations
from pyarrow.fs import FSSpecHandler

from cairn._src.errors import ConfigError, StorageError, UnknownSchemeError
from cairn._src.storage import registry
from cairn._src.storage.object_store import is_object_store, object_store_filesystem
from cairn._src.storage.paths import check_relative_path
from cairn._src.storage.uris import (
    fsspec_filesystem,
    join_path,
    local_root,
    normalize_path,
    normalize_uri,
    redact,
    scheme_of,
    scrub,
    strip_uri,
    supports_atomic_rename,
)

__all__ = ["StorageLocation", "local_root", "redact", "resolve", "supports_atomic_rename"]

logger = logging.getLogger(__name__)

_PYARROW_SCHEMES = frozenset({"s3", "gs", "gcs", "hdfs", "viewfs"})
# fsspec protocols that hold data in this process only.
_IN_PROCESS_PROTOCOLS = frozenset({"memory"})


@dataclass(frozen=True, eq=False)
class StorageLocation:
    """A place on storage: a filesystem and a ``/``-separated path in it.

    ``uri`` is a string a fresh process can pass to :func:`resolve` to reach the same
    place, or ``None`` when the location was built from a filesystem object or factory
    that no string can name. Pickling follows how the location was made: from a URI it
    pickles as that URI and resolves again on unpickling (so custom schemes work in
    workers that imported the registrations); from a filesystem object it pickles that
    object; from a factory it pickles the factory (cloudpickle handles lambdas).
    Instances are immutable and thread-safe.
    """

    filesystem: pafs.FileSystem
    path: str
    uri: str | None
    # How to rebuild the filesystem in another process: ("uri", base_uri),
    # ("fs", filesystem) or ("factory", factory).
    _source: tuple[str, Any] = field(default=("fs", None), repr=False, compare=False)

    def join(self, *parts: str) -> StorageLocation:
        """The location ``parts`` (relative, ``/``-separated) below this one.

        Raises :class:`~cairn._src.errors.UnsafePathError` for parts that would leave it.
        """
        joined = "/".join(part for part in parts if part not in ("", "."))
        if not joined:
            return self
        rel = check_relative_path(joined, argument="parts")
        uri = None
        if self.uri is not None:
            scheme = scheme_of(self.uri)
            if scheme is None:
                uri = join_path(self.uri, rel)
            else:
                base, question, query = self.uri.partition("?")
                # pyarrow percent-decodes URI paths; fsspec and custom schemes do not.
                quoted = rel
                if scheme in _PERCENT_DECODED_SCHEMES:
                    quoted = urllib.parse.quote(rel, safe="/")
                uri = f"{base.rstrip('/')}/{quoted}{question}{query}"
        path = join_path(self.path, rel)
        return StorageLocation(self.filesystem, path, uri, self._source)

    def display(self) -> str:
        """A string for logs and errors, with credentials redacted."""
        if self.uri is not None:
            return redact(self.uri)
        return f"{self.path!r} on a {self.filesystem.type_name} filesystem"

    @property
    def reachable_from_new_process(self) -> bool:
        """Whether :attr:`uri` names this place for any new process (driver restarts).

        False without a URI, and for in-process stores such as ``memory://``.
        """
        if self.uri is None:
            return False
        return scheme_of(self.uri) not in _IN_PROCESS_PROTOCOLS

    def __reduce__(self) -> tuple[Callable[..., StorageLocation], tuple[Any, ...]]:
        kind, payload = self._source
        if kind == "fs" and payload is None:
            payload = self.filesystem
        return (_restore, (kind, payload, self.path, self.uri))

    def __str__(self) -> str:
        return self.display()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StorageLocation):
            return NotImplemented
        if self.uri is not None and other.uri is not None:
            # One URI names one place, whichever store object each side resolved it to
            # (a factory may return a fresh store per call).
            return (self.uri, self.path) == (other.uri, other.path)
        return self.path == other.path and bool(self.filesystem.equals(other.filesystem))

    def __hash__(self) -> int:
        # pyarrow filesystems are unhashable; equal locations have equal paths and URIs.
        return hash((self.path, self.uri))


_PERCENT_DECODED_SCHEMES = frozenset({"file"}) | _PYARROW_SCHEMES


def _restore(kind: str, payload: Any, path: str, uri: str | None) -> StorageLocation:
    if kind == "uri":
        filesystem = resolve(payload).filesystem
    elif kind == "factory":
        made = payload()
        filesystem = _as_pyarrow(made, what=f"The filesystem factory returned {made!r}, which")
    else:
        filesystem = payload
    return StorageLocation(filesystem, path, uri, (kind, payload))


def _as_pyarrow(obj: Any, *, what: str) -> pafs.FileSystem:
    """``obj`` as a pyarrow FileSystem; ``what`` is the subject of the error sentence."""
    if isinstance(obj, pafs.FileSystem):
        return obj
    if isinstance(obj, fsspec.AbstractFileSystem):
        return pafs.PyFileSystem(FSSpecHandler(obj))
    if is_object_store(obj):
        return object_store_filesystem(obj)
    raise ConfigError(
        f"{what} is not storage Cairn can use; accepted: a pyarrow.fs.FileSystem, "
        "an fsspec filesystem, or an object with the ObjectStore methods (open_read, "
        "write, list, delete, stat)."
    )


def _location_string(location: object) -> str:
    if isinstance(location, (str, os.PathLike)):
        text = os.fspath(location)
        if isinstance(text, str) and text.strip():
            return text
    raise ConfigError(
        f"location={location!r} is not a storage location; pass a non-empty local path, "
        "a URI such as 's3://bucket/prefix' or 'memory://name', or a path together with "
        "a filesystem."
    )


def _local(path: str) -> StorageLocation:
    absolute = os.path.abspath(os.path.expanduser(path))
    fs = pafs.LocalFileSystem()
    # The plain absolute path is the URI: resolve() maps it back to the local disk.
    return StorageLocation(fs, absolute, absolute, ("uri", absolute))


def resolve(location: str | os.PathLike[str], filesystem: Any = None) -> StorageLocation:
    """Resolve ``location`` (and an optional ``filesystem``) to a :class:`StorageLocation`.

    ``location``: a local path, ``file://``, ``s3://`` (pyarrow's URI options such as
    ``?endpoint_override=host:port&scheme=http`` apply), ``gs://``, ``hdfs://``, any
    fsspec protocol (``memory://``, ``az://``, ...) or a scheme registered with
    :func:`~cairn.storage.register_scheme`. ``filesystem``: a ``pyarrow.fs.FileSystem``,
    an fsspec filesystem, an ``ObjectStore`` or a zero-argument factory returning one;
    ``location`` is then a path inside it.

    Does not check that the path exists. Raises :class:`UnknownSchemeError` for a scheme
    nothing handles and :class:`ConfigError` for malformed arguments. pyarrow itself
    contacts S3 to find a bucket's region when the URI gives neither ``region`` nor
    ``endpoint_override``, and connects to HDFS at once.
    """
    if isinstance(location, StorageLocation) and filesystem is None:
        return location
    text = _location_string(location)
    if filesystem is not None:
        return _resolve_in_filesystem(text, filesystem)
    scheme = scheme_of(text)
    if scheme is None:
        return _local(text)
    if scheme == "file":
        path = urllib.parse.unquote(urllib.parse.urlsplit(text).path) or "/"
        return _local(path)
    factory = registry.get_factory(scheme)
    if factory is not None:
        return _resolve_custom(text, scheme, factory)
    if scheme in _PYARROW_SCHEMES:
        native = _resolve_pyarrow(text, scheme)
        if native is not None:
            return native
    return _resolve_fsspec(text, scheme)


def _resolve_custom(text: str, scheme: str, factory: registry.Factory) -> StorageLocation:
    try:
        made = factory(text)
    except Exception as exc:
        raise StorageError(
            f"The storage factory registered for scheme {scheme!r} failed for "
            f"{redact(text)!r}: {exc}"
        ) from exc
    fs = _as_pyarrow(
        made, what=f"The factory registered for scheme {scheme!r} returned {made!r}, which"
    )
    path = strip_uri(text)
    path = path.strip("/") if is_object_store(made) else normalize_path(path)
    return StorageLocation(fs, path, normalize_uri(text), ("uri", normalize_uri(text)))


def _resolve_pyarrow(text: str, scheme: str) -> StorageLocation | None:
    try:
        fs, path = pafs.FileSystem.from_uri(text)
    except pa.ArrowNotImplementedError:
        # This pyarrow build lacks the backend (e.g. no GCS): let fsspec try.
        logger.debug("pyarrow cannot handle %s; trying fsspec", redact(text))
        return None
    except pa.ArrowInvalid as exc:
        raise ConfigError(
            f"location={redact(text)!r} is not a valid {scheme}:// URI: "
            f"{scrub(str(exc), text)}. See "
            "pyarrow.fs.FileSystem.from_uri for the accepted query parameters."
        ) from exc
    except OSError as exc:
        hint = " Add '?region=<bucket region>' to the URI." if scheme == "s3" else ""
        raise StorageError(
            f"Could not set up storage for {redact(text)!r}: {scrub(str(exc), text)}.{hint}"
        ) from exc
    uri = normalize_uri(text)
    return StorageLocation(fs, normalize_path(path), uri, ("uri", uri))


def _known_schemes() -> list[str]:
    names = {"file"} | _PYARROW_SCHEMES | set(known_implementations)
    names.update(registry.registered_schemes())
    return sorted(names)


def _resolve_fsspec(text: str, scheme: str) -> StorageLocation:
    try:
        fs_class = fsspec.get_filesystem_class(scheme)
    except ImportError as exc:
        package = _package_hint(scheme)
        hint = f" Install it with 'pip install {package}'." if package else ""
        raise UnknownSchemeError(
            f"location={redact(text)!r} needs a package that is not installed: {exc}.{hint}"
        ) from exc
    except ValueError as exc:
        raise UnknownSchemeError(
            f"location={redact(text)!r} uses the unknown scheme {scheme!r}. Known schemes: "
            f"{', '.join(_known_schemes())}. Install the fsspec package for it, or "
            "register your own store with cairn.storage.register_scheme() or an entry point "
            f"in group {registry.ENTRY_POINT_GROUP!r}."
        ) from exc
    try:
        fs, path = fsspec.core.url_to_fs(text)
    except ImportError as exc:
        raise UnknownSchemeError(
            f"location={redact(text)!r} needs a package that is not installed: {exc}"
        ) from exc
    except (ValueError, TypeError) as exc:
        raise ConfigError(
            f"location={redact(text)!r} is not a valid {scheme}:// URI for "
            f"{fs_class.__name__}: {scrub(str(exc), text)}"
        ) from exc
    uri = normalize_uri(text)
    return StorageLocation(
        pafs.PyFileSystem(FSSpecHandler(fs)), normalize_path(path), uri, ("uri", uri)
    )


def _package_hint(scheme: str) -> str | None:
    """The pip package providing fsspec protocol ``scheme``, when it is a separate one."""
    spec = known_implementations.get(scheme, {})
    package = str(spec.get("class", "")).split(".")[0]
    return package if package and package != "fsspec" else None


def _resolve_in_filesystem(text: str, filesystem: Any) -> StorageLocation:
    source: tuple[str, Any]
    if isinstance(filesystem, (pafs.FileSystem, fsspec.AbstractFileSystem)) or is_object_store(
        filesystem
    ):
        made = filesystem
        source = ("fs", None)
    elif callable(filesystem):
        try:
            made = filesystem()
        except Exception as exc:
            raise StorageError(f"The filesystem factory {filesystem!r} failed: {exc}") from exc
        source = ("factory", filesystem)
    else:
        made = filesystem
        source = ("fs", None)
    if source[0] == "factory":
        what = f"The filesystem factory {filesystem!r} returned {made!r}, which"
    else:
        what = f"filesystem={made!r}"
    fs = _as_pyarrow(made, what=what)
    if source[0] == "fs":
        source = ("fs", fs)
    if scheme_of(text) is not None:
        inner = fsspec_filesystem(fs)
        text = inner._strip_protocol(text) if inner is not None else strip_uri(text)
    root = local_root(fs)
    if root is not None:
        if root == "":
            text = os.path.abspath(os.path.expanduser(text))
        path = normalize_path(text)
        # A local directory is reachable by its OS path from any process on this machine.
        os_path = join_path(root, path.lstrip("/")) if root else path
        return StorageLocation(fs, path, os_path, source)
    path = text.strip("/") if is_object_store(made) else normalize_path(text)
    return StorageLocation(fs, path, None, source)
