"""The public surface of ``cairn.storage`` is pinned: changing it is a deliberate act."""

from __future__ import annotations

import cairn.storage


def test_exported_members() -> None:
    assert cairn.storage.__all__ == sorted(cairn.storage.__all__)
    assert cairn.storage.__all__ == [
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
    for name in cairn.storage.__all__:
        member = getattr(cairn.storage, name)
        assert member is not None
        if callable(member) and hasattr(member, "__module__"):
            assert member.__module__.startswith("cairn."), name
