"""The registry of custom URI schemes.

A scheme maps to a *factory*: ``factory(uri)`` returns the storage for that URI, as an
:class:`~cairn._src.storage.object_store.ObjectStore`, a ``pyarrow.fs.FileSystem`` or an
fsspec filesystem. Schemes come from two places:

* in code, with :func:`register_scheme` (these are what :func:`export_registrations`
  ships to worker processes);
* installed packages, through the entry point group ``cairn.storage``
  (``xyz = "pkg.module:factory"``); such an entry point is imported only when a URI with
  its scheme is first resolved, so a broken plugin never breaks unrelated runs.

In-code registrations win over entry points of the same name. The registry is
thread-safe.
"""

from __future__ import annotations

import importlib.metadata
import logging
import re
import sys
import threading
from collections.abc import Callable
from typing import Any

from cairn._src.errors import ConfigError, UnknownSchemeError

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "cairn.storage"

Factory = Callable[[str], Any]

# RFC 3986 scheme syntax, restricted to lower case so that one scheme has one spelling.
_SCHEME_RE = re.compile(r"^[a-z][a-z0-9+.\-]*$")

_lock = threading.Lock()
_registered: dict[str, Factory] = {}
_loaded_entry_points: dict[str, Factory] = {}
_entry_point_cache: tuple[tuple[str, ...], dict[str, importlib.metadata.EntryPoint]] | None = None


def _check_scheme(scheme: object) -> str:
    if not isinstance(scheme, str) or not _SCHEME_RE.match(scheme):
        raise ConfigError(
            f"scheme={scheme!r} is not a valid URI scheme; a scheme starts with a lower-case "
            "letter followed by lower-case letters, digits, '+', '-' or '.', and is given "
            "without '://' (for example 'xyz' for URIs 'xyz://bucket/path')."
        )
    if scheme == "file":
        raise ConfigError(
            "scheme='file' is reserved for local paths and cannot be registered; pick "
            "another name for your store."
        )
    return scheme


def register_scheme(scheme: str, factory: Factory, *, overwrite: bool = False) -> None:
    """Make URIs ``<scheme>://...`` resolve through ``factory(uri)``.

    ``factory`` receives the whole URI (query string included) and returns an
    ``ObjectStore``, a ``pyarrow.fs.FileSystem`` or an fsspec filesystem. The path inside
    the returned storage is the part of the URI after ``<scheme>://`` and before ``?``:
    ``xyz://bucket/a/b`` is path ``bucket/a/b``, so an ``ObjectStore`` sees keys such as
    ``bucket/a/b/model.pt``. Registering the same factory twice is a no-op; a different
    one needs ``overwrite=True``. For workers in other processes to resolve the scheme,
    the factory must be picklable (a module-level function, or anything cloudpickle
    handles).
    """
    scheme = _check_scheme(scheme)
    if not callable(factory):
        raise ConfigError(
            f"factory={factory!r} for scheme {scheme!r} is not callable; pass a function "
            "taking the URI and returning an ObjectStore, a pyarrow FileSystem or an "
            "fsspec filesystem."
        )
    with _lock:
        current = _registered.get(scheme)
        if current is not None and current is not factory and not overwrite:
            raise ConfigError(
                f"scheme={scheme!r} is already registered to {current!r}; pass "
                "overwrite=True to replace it, or call unregister_scheme() first."
            )
        _registered[scheme] = factory
    logger.debug("Registered storage scheme %r -> %r", scheme, factory)


def unregister_scheme(scheme: str) -> None:
    """Forget an in-code registration; a scheme that is not registered is ignored."""
    with _lock:
        _registered.pop(scheme, None)
        _loaded_entry_points.pop(scheme, None)


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    """The group's entry points, scanned once per ``sys.path`` (a scan takes milliseconds,
    and every URI resolution of an unregistered scheme asks)."""
    global _entry_point_cache
    key = tuple(sys.path)
    cached = _entry_point_cache
    if cached is not None and cached[0] == key:
        return cached[1]
    found = {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    _entry_point_cache = (key, found)
    return found


def registered_schemes() -> list[str]:
    """Sorted names of schemes registered in code or by installed entry points."""
    with _lock:
        names = set(_registered)
    names.update(_entry_points())
    return sorted(names)


def get_factory(scheme: str) -> Factory | None:
    """The factory for ``scheme``, loading its entry point on first use; ``None`` if none.

    Raises :class:`UnknownSchemeError` when the entry point exists but cannot be imported.
    """
    with _lock:
        factory = _registered.get(scheme) or _loaded_entry_points.get(scheme)
    if factory is not None:
        return factory
    entry_point = _entry_points().get(scheme)
    if entry_point is None:
        return None
    try:
        loaded = entry_point.load()
    except Exception as exc:
        raise UnknownSchemeError(
            f"The storage plugin for scheme {scheme!r} (entry point {entry_point.value!r} "
            f"in group {ENTRY_POINT_GROUP!r}) failed to import: {exc}. Reinstall the "
            "package that provides it."
        ) from exc
    if not callable(loaded):
        raise UnknownSchemeError(
            f"The storage plugin for scheme {scheme!r} (entry point {entry_point.value!r}) "
            f"is {loaded!r}, not a callable factory; the plugin must point at a function "
            "taking a URI."
        )
    logger.info("Loaded storage scheme %r from entry point %s", scheme, entry_point.value)
    with _lock:
        _loaded_entry_points[scheme] = loaded
    return loaded  # type: ignore[no-any-return]


def export_registrations() -> dict[str, Factory]:
    """A copy of the in-code registrations, for shipping to other processes.

    Entry points are not included: every process that has the plugin installed finds them
    by itself.
    """
    with _lock:
        return dict(_registered)


def import_registrations(regs: dict[str, Factory]) -> None:
    """Register every ``scheme -> factory`` of ``regs``, replacing existing ones.

    The process that exported them is authoritative, so they overwrite.
    """
    if not isinstance(regs, dict):
        raise ConfigError(
            f"regs={regs!r} must be a dict of scheme -> factory, as returned by "
            "export_registrations()."
        )
    for scheme, factory in regs.items():
        register_scheme(scheme, factory, overwrite=True)
