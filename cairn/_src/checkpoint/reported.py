"""``get_all_reported_checkpoints()``: the checkpoints reported so far in this run.

The names and semantics are Ray Train v2's (``ray.train.ReportedCheckpoint``,
``ReportedCheckpointStatus``, ``CheckpointConsistencyMode``). The call blocks until every
report this rank made so far is resolved: every rank reached it and its checkpoint is
committed (or refused or skipped); with ``VALIDATED``, also until no checkpoint of those
reports has a validation pending. ``timeout_s`` bounds the wait; when it passes, the
checkpoints known at that moment are returned, as in Ray Train. The list holds the
checkpoints retention kept (also those of earlier attempts and earlier ``fit()`` calls of
the run), in Ray's order: worst to best by ``checkpoint_score_attribute``, report order
without one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

from cairn._src.errors import ReportError

if TYPE_CHECKING:
    from cairn._src.checkpoint.checkpoint import Checkpoint


class ReportedCheckpointStatus(Enum):
    """Where a reported checkpoint stands (Ray Train's names).

    * ``COMMITTED``: committed, no validation was requested.
    * ``PENDING_VALIDATION``: committed, its validation has not finished.
    * ``VALIDATED``: committed and validated; the validation metrics are in ``metrics``.
    * ``VALIDATION_TIMEOUT``: the validation passed ``ValidationTaskConfig.timeout_s``.
    * ``VALIDATION_FAILED``: the validation function raised or returned no dict.
    """

    COMMITTED = "COMMITTED"
    PENDING_VALIDATION = "PENDING_VALIDATION"
    VALIDATED = "VALIDATED"
    VALIDATION_TIMEOUT = "VALIDATION_TIMEOUT"
    VALIDATION_FAILED = "VALIDATION_FAILED"


class CheckpointConsistencyMode(Enum):
    """Read semantics of :func:`get_all_reported_checkpoints` during a run.

    * ``COMMITTED``: wait until the checkpoints of this rank's reports so far are committed.
    * ``VALIDATED``: also wait until their validations finished (the default, as in Ray).
    """

    COMMITTED = "COMMITTED"
    VALIDATED = "VALIDATED"

    @classmethod
    def parse(cls, value: object) -> CheckpointConsistencyMode:
        if isinstance(value, cls):
            return value
        if isinstance(value, str) and value.upper() in cls.__members__:
            return cls[value.upper()]
        raise ReportError(
            f"get_all_reported_checkpoints(consistency_mode={value!r}) is not one of "
            "'COMMITTED', 'VALIDATED' (cairn.CheckpointConsistencyMode)."
        )


@dataclass
class ReportedCheckpoint:
    """A reported checkpoint and its metrics (rank 0's, merged with validation metrics)."""

    checkpoint: Checkpoint
    metrics: dict[str, Any]
    status: ReportedCheckpointStatus


def check_timeout(timeout_s: object) -> float | None:
    """``timeout_s`` as accepted by :func:`get_all_reported_checkpoints`."""
    if timeout_s is None:
        return None
    if (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
            or math.isnan(timeout_s) or timeout_s <= 0):
        raise ReportError(
            f"get_all_reported_checkpoints(timeout_s={timeout_s!r}) must be None (wait until "
            "done) or a number of seconds > 0."
        )
    return float(timeout_s)
