"""xyzstorage: an example object store (blobs in a SQLite file) and its Cairn plugin.

``xyzstorage.client`` is the store's own client and needs only the standard library;
``xyzstorage.cairn_plugin`` adapts it to ``cairn.storage.ObjectStore`` and is what the
``cairn.storage`` entry point ``xyz`` names. See README.md.
"""

from __future__ import annotations

from xyzstorage.client import (
    DB_ENV_VAR,
    SCHEME,
    Client,
    ObjectNotFound,
    StoreBusy,
    XyzError,
    connect,
    parse_uri,
)

__all__ = [
    "DB_ENV_VAR",
    "SCHEME",
    "Client",
    "ObjectNotFound",
    "StoreBusy",
    "XyzError",
    "connect",
    "parse_uri",
]
