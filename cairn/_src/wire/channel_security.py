"""What the control channel may carry, to whom, and how refusals are logged.

* TLS is opt-in: ``ScalingConfig(tls=True)``, or the ``CAIRN_TLS`` environment variable
  when the config leaves it at ``None`` (see :mod:`cairn._src.wire.tls`).
* Without TLS, a connection from another machine carries no storage credentials: every
  :class:`StorageLocation` sent on it is pickled with the credentials removed from its
  URI (:func:`~cairn._src.storage.uris.public_uri`), and that worker resolves the store
  with the credentials of its own environment (the provider's credential chain, or a
  registered scheme whose factory reads them). Connections from the driver's own machine,
  and every connection under TLS, carry the URI as given.
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


class _CredentialFreePickler(ForkingPickler):
    """Pickles storage locations with their URIs' credentials removed."""

    stripped = False

    def reducer_override(self, obj: Any) -> Any:
        if not isinstance(obj, StorageLocation):
            return NotImplemented
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


def dumps_without_credentials(message: object) -> tuple[bytes, bool]:
    """``message`` pickled as :class:`CredentialFreeConnection` sends it, and whether a
    credential was removed."""
    buffer = io.BytesIO()
    pickler = _CredentialFreePickler(buffer)
    pickler.dump(message)
    return buffer.getvalue(), pickler.stripped


class CredentialFreeConnection(Connection):
    """A connection whose sends never carry storage credentials (see the module doc).

    ``on_stripped`` is called (on the sending thread) each time a send removed one.
    """

    def __init__(self, handle: int, on_stripped: Callable[[], None]) -> None:
        super().__init__(handle)
        self._on_stripped = on_stripped

    def send(self, obj: Any) -> None:
        data, stripped = dumps_without_credentials(obj)
        self.send_bytes(data)
        if stripped:
            self._on_stripped()


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
