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
import re
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

logger = logging.getLogger(__name__)

_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
_PYARROW_SCHEMES = frozenset({"s3", "gs", "gcs", "hdfs", "viewfs"})
# Query parameters whose values are credentials. Matched as substrings of the lower-cased
# name, so 'aws_secret_access_key' and 'x-amz-security-token' are caught too.
_SECRET_WORDS = (
    "secret", "password", "passwd", "token", "access_key", "key_id", "credential",
    "signature", "sas", "sig", "auth", "private",
)
# fsspec protocols that hold data in this process only.
_IN_PROCESS_PROTOCOLS = frozenset({"memory"})


def redact(uri: str) -> str:
    """``uri`` with its password (``user:password@``) and secret query values hidden.

    Plain paths come back unchanged. Meant for logs and error messages.
    """
    match = _SCHEME_RE.match(uri)
    if match is None:
        return uri
    head = match.group(0)
    rest = uri[len(head):]
    rest, _, query = rest.partition("?")
    authority, slash, tail = rest.partition("/")
    if "@" in authority:
        userinfo, _, host = authority.rpartition("@")
        user = userinfo.partition(":")[0]
        authority = f"{user}:***@{host}" if user else f"***@{host}"
    out = f"{head}{authority}{slash}{tail}"
    if query:
        params = []
        for item in query.split("&"):
            name, eq, _value = item.partition("=")
            lowered = name.lower()
            if eq and any(word in lowered for word in _SECRET_WORDS):
                params.append(f"{name}=***")
            else:
                params.append(item)
        out = f"{out}?{'&'.join(params)}"
    return out


def _fsspec_filesystem(fs: pafs.FileSystem) -> Any:
    if isinstance(fs, pafs.PyFileSystem) and isinstance(fs.handler, FSSpecHandler):
        return fs.handler.fs
    return None


def local_root(fs: pafs.FileSystem) -> str | None:
    """The OS path that path ``""`` of ``fs`` maps to when ``fs`` is the local disk.

    ``"/"``-rooted for ``LocalFileSystem`` and fsspec's local filesystem, the base path
    of a ``SubTreeFileSystem`` over either; ``None`` for anything that is not local.
    """
    if isinstance(fs, pafs.LocalFileSystem):
        return ""
    if isinstance(fs, pafs.SubTreeFileSystem):
        base = local_root(fs.base_fs)
        if base is None:
            return None
        return base + str(fs.base_path).rstrip("/")
    inner = _fsspec_filesystem(fs)
    if inner is not None and "file" in _protocols(inner):
        return ""
    return None


def _protocols(fsspec_fs: Any) -> tuple[str, ...]:
    protocol = fsspec_fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def supports_atomic_rename(fs: pafs.FileSystem) -> bool:
    """Whether ``fs.move`` replaces a file atomically (local disks, HDFS).

    Object stores, fsspec's memory filesystem and custom stores rename by copying, so
    atomic writes there use a single object write instead.
    """
    if local_root(fs) is not None:
        return True
    if isinstance(fs, pafs.SubTreeFileSystem):
        return supports_atomic_rename(fs.base_fs)
    return bool(fs.type_name == "hdfs")


def _join_path(path: str, rel: str) -> str:
    if not rel:
        return path
    if path == "":
        return rel
    return f"{path.rstrip('/')}/{rel}"


@dataclass(frozen=True)
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
            scheme = _scheme_of(self.uri)
            if scheme is None:
                uri = _join_path(self.uri, rel)
            else:
                base, question, query = self.uri.partition("?")
                # pyarrow percent-decodes URI paths; fsspec and custom schemes do not.
                if scheme in _PERCENT_DECODED_SCHEMES:
                    rel = urllib.parse.quote(rel, safe="/")
                uri = f"{base.rstrip('/')}/{rel}{question}{query}"
        path = _join_path(self.path, check_relative_path(joined, argument="parts"))
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
        return _scheme_of(self.uri) not in _IN_PROCESS_PROTOCOLS

    def __reduce__(self) -> tuple[Callable[..., StorageLocation], tuple[Any, ...]]:
        kind, payload = self._source
        if kind == "fs" and payload is None:
            payload = self.filesystem
        return (_restore, (kind, payload, self.path, self.uri))

    def __str__(self) -> str:
        return self.display()


_PERCENT_DECODED_SCHEMES = frozenset({"file"}) | _PYARROW_SCHEMES


def _scheme_of(uri: str) -> str | None:
    match = _SCHEME_RE.match(uri)
    return match.group(1).lower() if match else None


def _restore(kind: str, payload: Any, path: str, uri: str | None) -> StorageLocation:
    if kind == "uri":
        filesystem = resolve(payload).filesystem
    elif kind == "factory":
        filesystem = _as_pyarrow(payload(), what="filesystem factory result")
    else:
        filesystem = payload
    return StorageLocation(filesystem, path, uri, (kind, payload))


def _as_pyarrow(obj: Any, *, what: str) -> pafs.FileSystem:
    if isinstance(obj, pafs.FileSystem):
        return obj
    if isinstance(obj, fsspec.AbstractFileSystem):
        return pafs.PyFileSystem(FSSpecHandler(obj))
    if is_object_store(obj):
        return object_store_filesystem(obj)
    raise ConfigError(
        f"{what}={obj!r} is not storage Cairn can use; accepted: a pyarrow.fs.FileSystem, "
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
    scheme = _scheme_of(text)
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


def _strip_uri(text: str) -> str:
    """The part of a URI after ``scheme://`` and before ``?`` or ``#``."""
    rest = text[len(_SCHEME_RE.match(text).group(0)):]  # type: ignore[union-attr]
    return re.split(r"[?#]", rest, maxsplit=1)[0]


def _normalize(path: str) -> str:
    stripped = path.rstrip("/")
    return stripped if stripped or not path.startswith("/") else "/"


def _resolve_custom(text: str, scheme: str, factory: registry.Factory) -> StorageLocation:
    try:
        made = factory(text)
    except Exception as exc:
        raise StorageError(
            f"The storage factory registered for scheme {scheme!r} failed for "
            f"{redact(text)!r}: {exc}"
        ) from exc
    fs = _as_pyarrow(made, what=f"the result of the factory for scheme {scheme!r}")
    path = _strip_uri(text)
    path = path.strip("/") if is_object_store(made) else _normalize(path)
    return StorageLocation(fs, path, _normalize_uri(text), ("uri", _normalize_uri(text)))


def _normalize_uri(text: str) -> str:
    base, question, query = text.partition("?")
    head = _SCHEME_RE.match(base).group(0)  # type: ignore[union-attr]
    body = base[len(head):].rstrip("/")
    return f"{head}{body}{question}{query}"


def _resolve_pyarrow(text: str, scheme: str) -> StorageLocation | None:
    try:
        fs, path = pafs.FileSystem.from_uri(text)
    except pa.ArrowNotImplementedError:
        # This pyarrow build lacks the backend (e.g. no GCS): let fsspec try.
        logger.debug("pyarrow cannot handle %s; trying fsspec", redact(text))
        return None
    except pa.ArrowInvalid as exc:
        raise ConfigError(
            f"location={redact(text)!r} is not a valid {scheme}:// URI: {exc}. See "
            "pyarrow.fs.FileSystem.from_uri for the accepted query parameters."
        ) from exc
    except OSError as exc:
        hint = " Add '?region=<bucket region>' to the URI." if scheme == "s3" else ""
        raise StorageError(
            f"Could not set up storage for {redact(text)!r}: {exc}.{hint}"
        ) from exc
    uri = _normalize_uri(text)
    return StorageLocation(fs, _normalize(path), uri, ("uri", uri))


def _known_schemes() -> list[str]:
    names = {"file"} | _PYARROW_SCHEMES | set(known_implementations)
    names.update(registry.registered_schemes())
    return sorted(names)


def _resolve_fsspec(text: str, scheme: str) -> StorageLocation:
    try:
        fs_class = fsspec.get_filesystem_class(scheme)
    except ImportError as exc:
        raise UnknownSchemeError(
            f"location={redact(text)!r} needs a package that is not installed: {exc} "
            f"(for example 'pip install {_package_hint(scheme)}')."
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
            f"{fs_class.__name__}: {exc}"
        ) from exc
    uri = _normalize_uri(text)
    return StorageLocation(
        pafs.PyFileSystem(FSSpecHandler(fs)), _normalize(path), uri, ("uri", uri)
    )


def _package_hint(scheme: str) -> str:
    spec = known_implementations.get(scheme, {})
    module = str(spec.get("class", scheme)).split(".")[0]
    return module


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
    fs = _as_pyarrow(made, what="filesystem")
    if source[0] == "fs":
        source = ("fs", fs)
    if _scheme_of(text) is not None:
        inner = _fsspec_filesystem(fs)
        text = inner._strip_protocol(text) if inner is not None else _strip_uri(text)
    root = local_root(fs)
    if root is not None:
        if root == "":
            text = os.path.abspath(os.path.expanduser(text))
        path = _normalize(text)
        # A local directory is reachable by its OS path from any process on this machine.
        os_path = _join_path(root, path.lstrip("/")) if root else path
        return StorageLocation(fs, path, os_path, source)
    path = text.strip("/") if is_object_store(made) else _normalize(text)
    return StorageLocation(fs, path, None, source)
