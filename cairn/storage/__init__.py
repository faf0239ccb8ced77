"""Storage for Cairn: resolve URIs and filesystems, plug in custom stores.

Every place Cairn reads or writes (run directories, checkpoints, references passed to
``report()``) is a :class:`StorageLocation`, made by :func:`resolve` from a local path, a
URI (``s3://``, ``gs://``, ``hdfs://``, ``memory://``, any fsspec protocol, a registered
scheme) or a filesystem object. A custom store implements :class:`ObjectStore` (five
methods) and is registered under a URI scheme with :func:`register_scheme` or the
``cairn.storage`` entry point group. Credentials in URIs stay in memory: :func:`redact`
masks them for messages, :func:`public_uri` drops them.
"""

from __future__ import annotations

from cairn._src.storage.checksum import CHECKSUM_ALGORITHM, FileEntry
from cairn._src.storage.location import (
    StorageLocation,
    public_uri,
    redact,
    resolve,
    supports_atomic_rename,
)
from cairn._src.storage.object_store import ObjectInfo, ObjectStore, object_store_filesystem
from cairn._src.storage.registry import (
    ENTRY_POINT_GROUP,
    export_registrations,
    import_registrations,
    register_scheme,
    registered_schemes,
    unregister_scheme,
)
from cairn._src.storage.retry import RetryPolicy, TransientStorageError
from cairn._src.storage.tuning import TransferConfig, set_transfer_config
from cairn._src.storage.tuning import current as transfer_config

__all__ = [
    "CHECKSUM_ALGORITHM",
    "ENTRY_POINT_GROUP",
    "FileEntry",
    "ObjectInfo",
    "ObjectStore",
    "RetryPolicy",
    "StorageLocation",
    "TransferConfig",
    "TransientStorageError",
    "export_registrations",
    "import_registrations",
    "object_store_filesystem",
    "public_uri",
    "redact",
    "register_scheme",
    "registered_schemes",
    "resolve",
    "set_transfer_config",
    "supports_atomic_rename",
    "transfer_config",
    "unregister_scheme",
]
