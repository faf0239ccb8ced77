"""What the control channel may carry, to whom, and how refusals are logged.

* TLS is opt-in: ``ScalingConfig(tls=True)``, or the ``CAIRN_TLS`` environment variable
  when the config leaves it at ``None`` (see :mod:`cairn._src.wire.tls`).
* Without TLS, a connection from another machine carries no storage credentials: every
  :class:`StorageLocation` sent on it is pickled with the credentials removed from its
  URI (:func:`~cairn._src.storage.uris.public_uri`), and that worker resolves the store
  with the credentials of its own environment (the provider's credential chain, or a
  registered scheme whose factory reads them). Connections from the driver's own machine,
  and every connection under TLS, carry the URI as given.
* A ``storage_filesystem`` object travels pickled, as given: its credentials cannot be
  removed. Without TLS, a send to another machine of one that holds explicit secrets
  (``S3FileSystem(secret_key=...)``, fsspec ``storage_options``: :func:`filesystem_secrets`)
  is flagged, and the driver warns once per host.
* A peer that fails the handshake is logged once per address, not once per connection
  (a port scanner, or a stale worker retrying, would otherwise flood the driver's log).
"""

from __future__ import annotations

import io
import ipaddress
import logging
import os
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any

from cairn._src.errors import ConfigError
from cairn._src.storage.location import StorageLocation
from cairn._src.storage.uris import credentials_in, public_uri

logger = logging.getLogger(__name__)

TLS_ENV = "CAIRN_TLS"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def tls_enabled(setting: bool | None) -> bool:
    """Whether the control channel uses TLS: ``setting`` (``ScalingConfig.tls``) when it
    is a bool, else the ``CAIRN_TLS`` environment variable (unset: off)."""
    if setting is not None:
        return bool(setting)
    value = os.environ.get(TLS_ENV, "")
    if value.strip().lower() in _TRUE:
        return True
    if value.strip().lower() in _FALSE:
        return False
    raise ConfigError(
        f"The environment variable {TLS_ENV}={value!r} is not one of "
        + ", ".join(repr(v) for v in (*_TRUE, *_FALSE[:-1]))
        + f" (unset means off). Set {TLS_ENV}=1 to encrypt the control channel, or pass "
        "ScalingConfig(tls=True)."
    )


def is_same_host(peer: str, bind_host: str) -> bool:
    """Whether a peer at ``peer`` runs on the driver's machine: a loopback address, or
    the address the controller listens on (a worker on the driver's node dials it)."""
    if peer == bind_host:
        return True
    try:
        return ipaddress.ip_address(peer).is_loopback
    except ValueError:
        return False


# Options of filesystem objects that hold a secret (pyarrow's S3FileSystem and
# GcsFileSystem, fsspec's s3fs, gcsfs and adlfs storage options).
_SECRET_OPTIONS = frozenset({"secret_key", "secret", "session_token", "token",
                             "access_token", "account_key", "sas_token", "client_secret",
                             "password"})


def filesystem_secrets(filesystem: object, depth: int = 0) -> list[str]:
    """The names of the secrets ``filesystem`` was built with explicitly: the options its
    pickle carries (``__reduce__``), fsspec's ``storage_options``, and those of the fsspec
    filesystem a pyarrow ``PyFileSystem`` wraps."""
    found: set[str] = set()

    def look(options: object) -> None:
        if isinstance(options, dict):
            found.update(k for k, v in options.items()
                         if isinstance(k, str) and k.lower() in _SECRET_OPTIONS and v)

    try:
        reduced = filesystem.__reduce__()
    except Exception:
        reduced = None
    if isinstance(reduced, tuple) and len(reduced) > 1 and isinstance(reduced[1], tuple):
        for argument in reduced[1]:
            look(argument)
    look(getattr(filesystem, "storage_options", None))
    inner = getattr(getattr(filesystem, "handler", None), "fs", None)
    if inner is not None and depth < 3:
        found.update(filesystem_secrets(inner, depth + 1))
    return sorted(found)


class _CredentialFreePickler(ForkingPickler):
    """Pickles storage locations with their URIs' credentials removed, and notes the
    secrets of a filesystem object that travels as given."""

    stripped = False
    # A filesystem object sent with explicit secrets: its type's module and name, and the
    # secrets' names.
    secrets: tuple[str, str, tuple[str, ...]] | None = None

    def reducer_override(self, obj: Any) -> Any:
        if not isinstance(obj, StorageLocation):
            return NotImplemented
        given = obj.given_filesystem()
        if given is not None and self.secrets is None:
            names = filesystem_secrets(given)
            if names:
                self.secrets = (type(given).__module__, type(given).__name__, tuple(names))
        restore, (kind, payload, path, uri, store_id) = obj.__reduce__()
        if kind == "uri" and isinstance(payload, str):
            if credentials_in(payload):
                self.stripped = True
            payload = public_uri(payload)
        if uri is not None:
            if credentials_in(uri):
                self.stripped = True
            uri = public_uri(uri)
        return restore, (kind, payload, path, uri, store_id)


def dumps_without_credentials(
        message: object) -> tuple[bytes, bool, tuple[str, str, tuple[str, ...]] | None]:
    """``message`` pickled as :class:`CredentialFreeConnection` sends it, whether a
    credential was removed, and the secrets of a filesystem object it carries as given
    (its type's module and name, and the secrets' names), if any."""
    buffer = io.BytesIO()
    pickler = _CredentialFreePickler(buffer)
    pickler.dump(message)
    return buffer.getvalue(), pickler.stripped, pickler.secrets


class CredentialFreeConnection(Connection):
    """A connection whose sends never carry credentials from a storage URI (see the module
    doc).

    ``on_stripped`` is called (on the sending thread) each time a send removed one, and
    ``on_secrets`` with a filesystem object's type and secret names each time a send
    carried one that holds explicit secrets.
    """

    def __init__(self, handle: int, on_stripped: Callable[[], None],
                 on_secrets: Callable[[str, tuple[str, ...]], None] | None = None) -> None:
        super().__init__(handle)
        self._on_stripped = on_stripped
        self._on_secrets = on_secrets

    def send(self, obj: Any) -> None:
        data, stripped, secrets = dumps_without_credentials(obj)
        self.send_bytes(data)
        if stripped:
            self._on_stripped()
        if secrets is not None and self._on_secrets is not None:
            module, name, names = secrets
            self._on_secrets(f"{module}.{name}", names)


class RefusalLog:
    """Logs a refused peer once per address (later refusals at debug level), and sums
    them up at the end. Thread-safe."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._counts: dict[str, int] = {}

    def refused(self, host: str, reason: object) -> None:
        with self._changed:
            count = self._counts.get(host, 0) + 1
            self._counts[host] = count
            if count == 1:
                logger.warning("Refused a connection to the controller from %s: %s (further "
                               "refusals from this address are logged at debug level)",
                               host, reason)
            else:
                logger.debug("Refused connection %d to the controller from %s: %s", count,
                             host, reason)
            self._changed.notify_all()

    def counts(self) -> dict[str, int]:
        with self._changed:
            return dict(self._counts)

    def wait_for(self, total: int, timeout_s: float) -> bool:
        """Wait until ``total`` refusals have been counted; whether they were."""
        with self._changed:
            return self._changed.wait_for(lambda: sum(self._counts.values()) >= total,
                                          timeout_s)

    def summarize(self) -> None:
        for host, count in sorted(self.counts().items()):
            if count > 1:
                logger.warning("Refused %d connections to the controller from %s in all",
                               count, host)
