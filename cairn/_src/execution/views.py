"""Turning committed-checkpoint views into user-facing :class:`Checkpoint` objects."""

from __future__ import annotations

from cairn._src.checkpoint.checkpoint import Checkpoint
from cairn._src.execution.messages import CheckpointView


def checkpoint_from_view(view: CheckpointView) -> Checkpoint:
    """A checkpoint that reads its data from ``view.data`` and verifies it against the
    manifest at ``view.manifest_at`` (the same place, unless registered by reference)."""
    return Checkpoint._from_committed(view.data, manifest_location=view.manifest_at)
