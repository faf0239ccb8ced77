"""Storage locations: a ``pyarrow.fs.FileSystem``, a path in it, and how to reach it again.

:func:`resolve` turns what users pass (a local path, a URI, a filesystem object or a
factory) into a :class:`StorageLocation`. Internally every backend is a
``pyarrow.fs.FileSystem``; fsspec filesystems and custom object stores are adapted.

Resolution order for a URI ``<scheme>://...``: a scheme registered in code or by an entry
point, then pyarrow's native backends (``s3``, ``gs``/``gcs``, ``hdfs``, ``viewfs``),
then any fsspec protocol. ``file://`` URIs and plain paths are the local file system. A
string that is a known scheme followed by ``:`` and fewer than two slashes (``s3:/b/x``,
``s3:b/x``, ``file:/x``), or by ``//`` (``s3//b/x``), is refused with the corrected URI:
it is a typo, not a local path (:mod:`.location_checks`, which also refuses non-UTF-8).

Storage objects (a filesystem, an ``ObjectStore``, a factory) travel to other processes
with cloudpickle, so a ``FileSystemHandler`` whose class is defined in the driver's
``__main__`` reaches the workers. Credentials in URIs follow the rule of
:mod:`cairn._src.storage.uris`: ``repr``/``str``/:meth:`StorageLocation.display` never
show them, and malformed-URI errors are raised without the backend's raw exception.
"""

from __future__ import annotations

import logging
import os
import threading
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import cloudpickle
import fsspec
import pyarrow as pa
import pyarrow.fs as pafs
from fsspec.registry import known_implementations
from pyarrow.fs import FSSpecHandler

from cairn._src.errors import ConfigError, StorageError, UnknownSchemeError
from cairn._src.storage import registry
from cairn._src.storage.location_checks import (
    PYARROW_SCHEMES,
    check_uri_typo,
    check_utf8,
    known_scheme_set,
    known_schemes,
)
from cairn._src.storage.object_store import is_object_store, object_store_filesystem
from cairn._src.storage.paths import check_relative_path
from cairn._src.storage.uris import (
    backend_message,
    dot_component,
    fsspec_filesystem,
    join_path,
    local_os_join,
    local_root,
    normalize_path,
    normalize_uri,
    public_uri,
    redact,
    scheme_of,
    strip_uri,
    supports_atomic_rename,
    without_userinfo,
)

__all__ = ["StorageLocation", "check_picklable", "check_uri_typo", "local_root", "public_uri",
           "redact", "resolve", "supports_atomic_rename", "uri_can_carry"]

logger = logging.getLogger(__name__)

_PYARROW_SCHEMES = PYARROW_SCHEMES
_PERCENT_DECODED_SCHEMES = frozenset({"file"}) | _PYARROW_SCHEMES
# fsspec protocols that hold data in this process only.
_IN_PROCESS_PROTOCOLS = frozenset({"memory"})


@dataclass(frozen=True, eq=False)
class StorageLocation:
    """A place on storage: a filesystem and a ``/``-separated path in it.

    ``uri`` is a string a fresh process can pass to :func:`resolve` to reach the same
    place, or ``None`` when the location was built from a filesystem object or factory
    that no string can name. ``uri`` may hold credentials (they stay in memory); ``repr``,
    ``str`` and :meth:`display` mask them, :attr:`public_uri` drops them.

    Pickling follows how the location was made: from a URI it pickles as that URI and
    resolves again on unpickling (so custom schemes work in workers that imported the
    registrations); from a filesystem object it pickles that object, from a factory the
    factory, both with cloudpickle (classes and lambdas of ``__main__`` travel by value).
    Locations made from one filesystem object or factory, and every location joined from
    them, keep a store identity across pickling, so :meth:`same_store` knows two copies
    in different processes for one store. Instances are immutable and thread-safe.
    """

    filesystem: pafs.FileSystem
    path: str
    uri: str | None
    # How to rebuild the filesystem in another process: ("uri", base_uri),
    # ("fs", filesystem) or ("factory", factory).
    _source: tuple[str, Any] = field(default=("fs", None), repr=False, compare=False)
    # Identifies the store object (or factory) a location without a URI was made from;
    # survives pickling, so copies of one store in several processes are one store.
    _store_id: str | None = field(default=None, repr=False, compare=False)

    def join(self, *parts: str) -> StorageLocation:
        """The location ``parts`` (relative, ``/``-separated) below this one.

        Its :attr:`uri` is ``None`` where no URI names that place (:func:`uri_can_carry`).
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
            elif uri_can_carry(scheme, rel):
                base, question, query = self.uri.partition("?")
                # pyarrow percent-decodes URI paths; fsspec and custom schemes do not.
                quoted = (urllib.parse.quote(rel, safe="/")
                          if scheme in _PERCENT_DECODED_SCHEMES else rel)
                uri = f"{base.rstrip('/')}/{quoted}{question}{query}"
        path = join_path(self.path, rel)
        return StorageLocation(self.filesystem, path, uri, self._source, self._store_id)

    def with_path(self, path: str) -> StorageLocation:
        """The location ``path`` (a path inside :attr:`filesystem`) on this same store.

        For a store with no URI the result has no URI either; for a local disk it is the
        OS path. Used to rebind a path recorded by the run onto the run's own store.
        """
        uri = path if self.uri is not None and scheme_of(self.uri) is None else None
        return StorageLocation(self.filesystem, path, uri, self._source, self._store_id)

    def display(self) -> str:
        """A string for logs and errors, with credentials masked (see :func:`redact`)."""
        if self.uri is not None:
            return redact(self.uri)
        return f"{self.path!r} on a {self.filesystem.type_name} filesystem"

    @property
    def public_uri(self) -> str | None:
        """:attr:`uri` without credentials (see :func:`public_uri`), for what users copy
        and resolve again (``Result.uri``); ``None`` without a URI."""
        return public_uri(self.uri) if self.uri is not None else None

    def same_store(self, other: StorageLocation) -> bool:
        """Whether ``other`` is on the same store, so that paths of the two compare.

        True for one filesystem object, for copies of one store object or factory (also
        across processes), for URIs with the same scheme, authority and query (local paths
        are all one store), and for filesystems that ``equals()`` says are equal.
        """
        if self.filesystem is other.filesystem:
            return True
        if self._store_id is not None and self._store_id == other._store_id:
            return True
        if self.uri is not None and other.uri is not None:
            return _store_key(self.uri) == _store_key(other.uri)
        try:
            return bool(self.filesystem.equals(other.filesystem))
        except Exception:
            # A user handler's __eq__ may fail on a foreign handler: not the same store.
            return False

    def contains(self, other: StorageLocation, *, strictly: bool = False) -> bool:
        """Whether ``other`` is this location or lies below it, on the same store; with
        ``strictly``, only below it. The one meaning of "inside" for locations.

        Local paths are compared after resolving symlinks, so a link to a directory is
        that directory. Query parameters of a URI (an endpoint, a database file) name the
        store, not the path (:meth:`same_store`).
        """
        if not self.same_store(other):
            return False
        mine, theirs = _comparable_path(self), _comparable_path(other)
        if theirs.rstrip("/") == mine.rstrip("/"):
            return not strictly
        if mine in ("", "/"):
            return True
        return theirs.startswith(mine.rstrip("/") + "/")

    @property
    def in_process(self) -> bool:
        """Whether the store holds its data in this process only (``memory://``, an fsspec
        ``MemoryFileSystem`` object, pyarrow's mock filesystem): worker processes and new
        drivers would each see an empty store of their own."""
        if self.uri is not None and scheme_of(self.uri) in _IN_PROCESS_PROTOCOLS:
            return True
        inner = fsspec_filesystem(self.filesystem)
        if inner is not None and _IN_PROCESS_PROTOCOLS & set(_protocols_of(inner)):
            return True
        return bool(self.filesystem.type_name == "mock")

    @property
    def reachable_from_new_process(self) -> bool:
        """Whether :attr:`uri` names this place for any new process (driver restarts).

        False without a URI, and for in-process stores such as ``memory://``.
        """
        if self.uri is None:
            return False
        return scheme_of(self.uri) not in _IN_PROCESS_PROTOCOLS

    def given_filesystem(self) -> Any:
        """The filesystem object this location was resolved in, as given, when it travels
        pickled to other processes (not a URI, not a factory that each process calls);
        else None."""
        kind, payload = self._source
        if kind != "fs":
            return None
        return payload if payload is not None else self.filesystem

    def __reduce__(self) -> tuple[Callable[..., StorageLocation], tuple[Any, ...]]:
        kind, payload = self._source
        if kind == "fs" and payload is None:
            payload = self.filesystem
        if kind in ("fs", "factory"):
            # cloudpickle, whatever pickler the message travels with: a handler class
            # defined in the driver's __main__ is sent by value, not by a name the worker
            # cannot import.
            payload = bytes(cloudpickle.dumps(payload))
        return (_restore, (kind, payload, self.path, self.uri, self._store_id))

    def __str__(self) -> str:
        return self.display()

    def __repr__(self) -> str:
        return f"StorageLocation({self.display()!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StorageLocation):
            return NotImplemented
        if self.uri is not None and other.uri is not None:
            # One URI names one place, whichever store object each side resolved it to
            # (a factory may return a fresh store per call).
            return (self.uri, self.path) == (other.uri, other.path)
        return self.path == other.path and self.same_store(other)

    def __hash__(self) -> int:
        # pyarrow filesystems are unhashable; equal locations have equal paths and URIs.
        return hash((self.path, self.uri))


def uri_can_carry(scheme: str | None, path: str) -> bool:
    """Whether a URI of ``scheme`` (``None``: a local path) can name ``path`` below its own:
    not when ``path`` holds ``?`` or ``#`` and ``scheme`` is an fsspec protocol or a
    registered scheme, whose paths are never percent-decoded and end at ``?`` or ``#``."""
    return scheme in _PERCENT_DECODED_SCHEMES or scheme is None or not {"?", "#"} & set(path)


def _check_remote_path(text: str, fs: pafs.FileSystem, path: str) -> None:
    """Refuse a :func:`~.uris.dot_component` in ``path`` on storage that is not a local
    disk."""
    dot = dot_component(path)
    if dot is not None and local_root(fs) is None:
        raise ConfigError(
            f"location={redact(text)!r} has the path component {dot!r}, which only a "
            "local disk resolves reliably; accepted: a path without '.' and '..' "
            "components, such as 's3://bucket/team/runs'.")


def _store_key(uri: str) -> tuple[str | None, str, str]:
    """What names the store of ``uri``: scheme, authority unless it is part of the path
    (a bucket), and query. All local paths are one store."""
    scheme = scheme_of(uri)
    if scheme is None:
        return (None, "", "")
    base, _, query = uri.partition("?")
    authority = base[len(scheme) + 3:].partition("/")[0]
    return (scheme, authority, query)


def _comparable_path(location: StorageLocation) -> str:
    root = local_root(location.filesystem)
    if root is not None:
        os_path = local_os_join(root, location.path)
        return os.path.realpath(os_path)
    return location.path


def _protocols_of(fsspec_fs: Any) -> tuple[str, ...]:
    protocol = fsspec_fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


# Store objects by store id, in this process: every location of one store that is
# unpickled here shares one filesystem object (a factory is called once per process, not
# once per message), and the process that made the store gets its own object back.
_stores: dict[str, tuple[pafs.FileSystem, tuple[str, Any]]] = {}
_stores_lock = threading.Lock()


# One store id per store object or factory given in this process (kept alive with it, so
# that its id() is not reused): the same object resolved twice is one store.
_ids_by_object: dict[int, tuple[object, str]] = {}


def _store_id_of(obj: object) -> str:
    with _stores_lock:
        known = _ids_by_object.get(id(obj))
        if known is None or known[0] is not obj:
            known = (obj, uuid.uuid4().hex)
            _ids_by_object[id(obj)] = known
        return known[1]


def _remember_store(location: StorageLocation) -> StorageLocation:
    store_id = location._store_id
    if store_id is not None:
        with _stores_lock:
            _stores.setdefault(store_id, (location.filesystem, location._source))
            # Its filesystem object, passed again (get_storage().storage_filesystem in a
            # worker), is the same store: Checkpoint(path, filesystem=it) gets this id.
            fs = location.filesystem
            known = _ids_by_object.get(id(fs))
            if known is None or known[0] is not fs:
                _ids_by_object[id(fs)] = (fs, store_id)
    return location


def _restore(kind: str, payload: Any, path: str, uri: str | None,
             store_id: str | None = None) -> StorageLocation:
    if store_id is not None:
        with _stores_lock:
            known = _stores.get(store_id)
        if known is not None:
            return StorageLocation(known[0], path, uri, known[1], store_id)
    if kind in ("fs", "factory") and isinstance(payload, bytes):
        payload = cloudpickle.loads(payload)
    if kind == "uri":
        filesystem = resolve(payload).filesystem
    elif kind == "factory":
        made = payload()
        filesystem = _as_pyarrow(made, what=f"The filesystem factory returned {made!r}, which")
    else:
        filesystem = payload
    restored = StorageLocation(filesystem, path, uri, (kind, payload), store_id)
    return _remember_store(restored) if kind != "uri" else restored


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


def check_picklable(value: object, *, argument: str) -> None:
    """Raise :class:`ConfigError` when ``value`` cannot be pickled with cloudpickle.

    The error names the argument and the object, quotes the pickling error and gives the
    routes that work: a zero-argument factory, or a registered URI scheme.
    """
    try:
        cloudpickle.dumps(value)
    except Exception as exc:
        raise ConfigError(
            f"{argument}={value!r} cannot be pickled with cloudpickle "
            f"({type(exc).__name__}: {exc}), so worker processes cannot receive it. Pass a "
            "zero-argument factory that builds the filesystem in each process instead "
            "(storage_filesystem=make_filesystem, a function that opens its connections "
            "when called), or register a URI scheme whose factory builds it "
            "(cairn.storage.register_scheme('myfs', factory)) and pass "
            "storage_path='myfs://...'."
        ) from exc


_known_scheme_set = known_scheme_set
_known_schemes = known_schemes


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
    nothing handles and :class:`ConfigError` for malformed arguments (a mistyped URI such
    as ``s3:/bucket`` or ``s3//bucket``, a path that is not valid UTF-8). pyarrow itself
    contacts S3 to find a bucket's region when the URI gives neither ``region`` nor
    ``endpoint_override``, and connects to HDFS at once.
    """
    if isinstance(location, StorageLocation) and filesystem is None:
        return location
    text = _location_string(location)
    check_utf8(text)
    if filesystem is not None:
        return _resolve_in_filesystem(text, filesystem)
    scheme = scheme_of(text)
    if scheme is None:
        check_uri_typo(text)
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
        # Not chained: the factory's exception may quote the URI with its credentials.
        raise StorageError(
            f"The storage factory registered for scheme {scheme!r} failed for "
            f"{redact(text)!r}: {type(exc).__name__}: {backend_message(str(exc), text)}"
        ) from None
    fs = _as_pyarrow(
        made, what=f"The factory registered for scheme {scheme!r} returned {made!r}, which"
    )
    # The user info says who connects (the factory has it), never where: a password in
    # it would otherwise be in every key written and in every display of the path.
    path = strip_uri(without_userinfo(text))
    path = path.strip("/") if is_object_store(made) else normalize_path(path)
    _check_remote_path(text, fs, path)
    return StorageLocation(fs, path, normalize_uri(text), ("uri", normalize_uri(text)))


def _resolve_pyarrow(text: str, scheme: str) -> StorageLocation | None:
    try:
        fs, path = pafs.FileSystem.from_uri(text)
    except pa.ArrowNotImplementedError:
        # This pyarrow build lacks the backend (e.g. no GCS): let fsspec try.
        logger.debug("pyarrow cannot handle %s; trying fsspec", redact(text))
        return None
    except pa.ArrowInvalid as exc:
        # Not chained: pyarrow's exception quotes the raw URI, credentials included.
        raise ConfigError(
            f"location={redact(text)!r} is not a valid {scheme}:// URI: "
            f"{backend_message(str(exc), text)}. See "
            "pyarrow.fs.FileSystem.from_uri for the accepted query parameters."
        ) from None
    except OSError as exc:
        hint = " Add '?region=<bucket region>' to the URI." if scheme == "s3" else ""
        raise StorageError(
            f"Could not set up storage for {redact(text)!r}: "
            f"{backend_message(str(exc), text)}.{hint}"
        ) from None
    uri = normalize_uri(text)
    _check_remote_path(text, fs, path)
    return StorageLocation(fs, normalize_path(path), uri, ("uri", uri))


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
            f"{fs_class.__name__}: {backend_message(str(exc), text)}"
        ) from None
    uri = normalize_uri(text)
    wrapped = pafs.PyFileSystem(FSSpecHandler(fs))
    _check_remote_path(text, wrapped, path)
    return StorageLocation(wrapped, normalize_path(path), uri, ("uri", uri))


def _package_hint(scheme: str) -> str | None:
    """The pip package providing fsspec protocol ``scheme``, when it is a separate one."""
    spec = known_implementations.get(scheme, {})
    package = str(spec.get("class", "")).split(".")[0]
    return package if package and package != "fsspec" else None


def _resolve_in_filesystem(text: str, filesystem: Any) -> StorageLocation:
    source: tuple[str, Any] = ("fs", None)
    store_id = _store_id_of(filesystem)
    made, what = filesystem, f"filesystem={filesystem!r}"
    if callable(filesystem) and not (isinstance(filesystem, (
            pafs.FileSystem, fsspec.AbstractFileSystem)) or is_object_store(filesystem)):
        try:
            made = filesystem()
        except Exception as exc:
            raise StorageError(f"The filesystem factory {filesystem!r} failed: {exc}") from exc
        source = ("factory", filesystem)
        what = f"The filesystem factory {filesystem!r} returned {made!r}, which"
    fs = _as_pyarrow(made, what=what)
    if source[0] == "fs":
        source = ("fs", fs)
    scheme = scheme_of(text)
    root = local_root(fs)
    if scheme is not None:
        inner = fsspec_filesystem(fs)
        _check_scheme_fits(text, scheme, fs, inner, local=root is not None)
        text = (inner._strip_protocol(text) if inner is not None
                else strip_uri(without_userinfo(text)))
    if root is not None:
        if root == "" and not isinstance(fs, pafs.SubTreeFileSystem):
            # The disk itself: a relative path is relative to the working directory. Paths
            # in a SubTreeFileSystem (rooted at "/" too) are relative to its base.
            text = os.path.abspath(os.path.expanduser(text))
        path = normalize_path(text)
        # A local directory is reachable by its OS path from any process on this machine.
        os_path = local_os_join(root, path)
        return _remember_store(StorageLocation(fs, path, os_path, source, store_id))
    path = text.strip("/") if is_object_store(made) else normalize_path(text)
    _check_remote_path(text, fs, path)
    return _remember_store(StorageLocation(fs, path, None, source, store_id))


# The URI schemes each kind of file system serves; one given with a URI of another scheme
# would take the rest of the URI for a path of its own ("s3://bucket/x" on the local disk:
# ./bucket/x), so it is refused, as pyarrow refuses a URI for a local file system.
_SCHEMES_OF = {"local": {"file", "local"}, "s3": {"s3", "s3a"}, "gcs": {"gs", "gcs"},
               "hdfs": {"hdfs", "viewfs"}}


def _check_scheme_fits(text: str, scheme: str, fs: pafs.FileSystem, inner: Any, *,
                       local: bool) -> None:
    if inner is not None:
        protocols = inner.protocol if isinstance(inner.protocol, tuple) else (inner.protocol,)
        served = {str(p).lower() for p in protocols}
    else:
        served = _SCHEMES_OF.get("local" if local else fs.type_name, set())
    if served and scheme not in served:
        raise ConfigError(
            f"location={redact(text)!r} is a {scheme}:// URI, but the file system given "
            f"with it ({type(inner or fs).__name__}) serves {'/'.join(sorted(served))}:// "
            "only. Pass a path on that file system, or the URI without a file system."
        )
