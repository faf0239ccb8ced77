"""``StorageOptions``: how one run (or one caller) moves bytes, passed along explicitly.

One object carries what changes how storage is used: the transfer settings
(:class:`TransferConfig`), the retry budget (:class:`RetryPolicy`) and, in a worker, the
node's local tier that restores may read from instead of storage. It is built from the
run's ``RunConfig`` in the driver and from the ``SetupMessage`` in each worker, and handed
to whatever transfers: no module global of Cairn changes what a transfer or a restore
does, so two ``fit()`` calls in one process never see each other's settings.

Store identity is not here: it travels inside each :class:`StorageLocation` (its store id,
pickled with it); the table that maps a store id to this process's filesystem object is a
per-process cache (``ARCHITECTURE.md``, "Module-level state").

Thread-safety: immutable; share it freely.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

from cairn._src.errors import ConfigError
from cairn._src.storage.location import StorageLocation
from cairn._src.storage.retry import RetryPolicy
from cairn._src.storage.tuning import TransferConfig

logger = logging.getLogger(__name__)

__all__ = ["LocalCopies", "StorageOptions"]


class LocalCopies(Protocol):
    """A node's copies of committed checkpoints that a restore may read instead of storage
    (:class:`cairn._src.checkpoint.local_tier.LocalTier`)."""

    def restore(self, manifest_location: StorageLocation, manifest: Any, target: str,
                retry: RetryPolicy) -> bool:
        """Restore the checkpoint of ``manifest`` into ``target``; False: use storage."""
        ...


@dataclass(frozen=True, kw_only=True)
class StorageOptions:
    """Transfer settings, retry budget and local tier of one run (see the module doc).

    ``transfer``: ``None`` uses the settings of :func:`cairn.storage.set_transfer_config`
    (the defaults unless a user changed them); a run's ``RunConfig.storage_transfer``
    otherwise. ``local_tier``: only a worker of a run with a local tier has one.
    ``fsync`` (``RunConfig.storage_fsync``): on storage with an OS path, every uploaded
    file and its directories are fsynced before they are announced for a commit, and
    manifests and the run index are fsynced before and after their rename
    (:mod:`.durability`); False for scratch storage (tmpfs) whose commits need survive
    a killed process only.
    """

    transfer: TransferConfig | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    local_tier: LocalCopies | None = None
    fsync: bool = True

    def __post_init__(self) -> None:
        if self.transfer is not None and not isinstance(self.transfer, TransferConfig):
            raise ConfigError(
                f"StorageOptions.transfer={self.transfer!r} must be a "
                "cairn.storage.TransferConfig or None (the process's settings)."
            )
        if not isinstance(self.retry, RetryPolicy):
            raise ConfigError(
                f"StorageOptions.retry={self.retry!r} must be a cairn.storage.RetryPolicy; "
                "pass RetryPolicy() for the defaults."
            )
        if not isinstance(self.fsync, bool):
            raise ConfigError(
                f"StorageOptions.fsync={self.fsync!r} must be True (commits are durable: "
                "data, manifests and the index fsynced) or False (scratch storage)."
            )

    def __getstate__(self) -> dict[str, Any]:
        # A local tier is one node's: a checkpoint pickled elsewhere restores from storage.
        return {"transfer": self.transfer, "retry": self.retry, "local_tier": None,
                "fsync": self.fsync}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)
