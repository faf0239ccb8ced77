"""The Cairn storage plugin for ``xyz://`` URIs: :class:`XyzStore` over the xyz client.

Installed as the entry point ``xyz = "xyzstorage.cairn_plugin:store_from_uri"`` in group
``cairn.storage``, so every process that has this package installed (the driver, its
workers, a driver restarted after a crash) resolves ``xyz://bucket/key?db=...`` by itself;
nothing has to be registered in code.

The adapter's whole job is to map the five methods of ``cairn.storage.ObjectStore`` to the
client and convert the client's errors at the boundary: a missing object becomes
``FileNotFoundError`` (Cairn's "does not exist"), a busy database becomes
``TransientStorageError`` (Cairn retries it with backoff), anything else stays permanent.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any, BinaryIO

from cairn.storage import ObjectInfo, TransientStorageError
from xyzstorage.client import Client, ObjectNotFound, StoreBusy, connect, parse_uri


@contextlib.contextmanager
def _translated() -> Iterator[None]:
    try:
        yield
    except ObjectNotFound as exc:
        raise FileNotFoundError(str(exc)) from exc
    except StoreBusy as exc:
        raise TransientStorageError(str(exc)) from exc


class XyzStore:
    """A ``cairn.storage.ObjectStore`` over one xyz database. Thread- and process-safe
    (the client is). Pickles as its database path."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def open_read(self, key: str) -> BinaryIO:
        with _translated():
            return self.client.open(key)

    def write(self, key: str, stream: BinaryIO) -> None:
        with _translated():
            self.client.put(key, stream)

    def list(self, prefix: str) -> list[ObjectInfo]:
        with _translated():
            return [ObjectInfo(key, size) for key, size in self.client.scan(prefix)]

    def delete(self, key: str) -> None:
        with _translated():
            self.client.delete(key)

    def stat(self, key: str) -> ObjectInfo | None:
        with _translated():
            size = self.client.size(key)
        return None if size is None else ObjectInfo(key, size)

    def __reduce__(self) -> tuple[Any, ...]:
        return (store_for_database, (self.client.db_path,))

    def __repr__(self) -> str:
        return f"XyzStore({self.client.db_path!r})"


_stores: dict[str, XyzStore] = {}
_lock = threading.Lock()


def store_for_database(db_path: str) -> XyzStore:
    """The one :class:`XyzStore` of this process for the database ``db_path``."""
    client = connect(db_path)
    with _lock:
        store = _stores.get(client.db_path)
        if store is None:
            store = _stores[client.db_path] = XyzStore(client)
        return store


def store_from_uri(uri: str) -> XyzStore:
    """The factory Cairn calls with a whole ``xyz://`` URI (query string included).

    Returns the same store for every URI of one database: Cairn compares the storage of
    two locations by identity (two ranks reporting one NO_UPLOAD checkpoint must resolve
    to the same store), and sharing it shares the connections and the write lock.
    """
    db_path, _key = parse_uri(uri)
    return store_for_database(db_path)
