"""``get_all_reported_checkpoints()``, the public function (see :mod:`reported`)."""

from __future__ import annotations

from cairn._src.checkpoint.reported import CheckpointConsistencyMode, ReportedCheckpoint
from cairn._src.worker.session import get_session


def get_all_reported_checkpoints(
    consistency_mode: CheckpointConsistencyMode | str = CheckpointConsistencyMode.VALIDATED,
    timeout_s: float | None = None,
) -> list[ReportedCheckpoint]:
    """The checkpoints reported so far in this run (those retention kept), as Ray Train's.

    Blocks until every report this rank made so far is resolved: all ranks reached it and
    its checkpoint is committed; with ``VALIDATED`` (the default), also until their
    validations finished. After ``timeout_s`` seconds (None: no limit), returns what is
    known then. Order: worst to best by ``checkpoint_score_attribute``, report order
    without one. Each :class:`ReportedCheckpoint` has the checkpoint, its metrics (rank
    0's, merged with validation metrics) and its :class:`ReportedCheckpointStatus`.
    """
    return get_session("get_all_reported_checkpoints").get_all_reported_checkpoints(
        consistency_mode, timeout_s
    )
