"""Retention policies: which committed checkpoints to keep.

Policies are pure: they look at the committed records and return one keep/drop decision
per record. The checkpoint manager acts on the decision (index first, deletion after).
Whatever a policy says, the latest committed checkpoint and the one the current attempt
resumed from are kept: :func:`decide_retention` enforces that on top of any policy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from cairn._src.checkpoint.index import CheckpointRecord


class RetentionPolicy(Protocol):
    def should_keep(self, records: Sequence[CheckpointRecord]) -> list[bool]:
        """One decision per record, in the same order."""


@dataclass(frozen=True)
class KeepAll:
    def should_keep(self, records: Sequence[CheckpointRecord]) -> list[bool]:
        return [True] * len(records)


@dataclass(frozen=True)
class KeepLatest:
    """Keep the ``n`` checkpoints with the highest report index."""

    n: int

    def should_keep(self, records: Sequence[CheckpointRecord]) -> list[bool]:
        ranked = sorted(range(len(records)), key=lambda i: records[i].report_index, reverse=True)
        kept = set(ranked[: self.n])
        return [i in kept for i in range(len(records))]


def _score(record: CheckpointRecord, attribute: str) -> float:
    value: Any = record.metrics
    for part in attribute.split("/"):
        value = value.get(part) if isinstance(value, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return -math.inf
    return float(value)


@dataclass(frozen=True)
class KeepBest:
    """Keep the ``n`` checkpoints with the best score; ties go to the later report."""

    n: int
    attribute: str
    order: Literal["max", "min"] = "max"

    def scores(self, records: Sequence[CheckpointRecord]) -> list[float]:
        sign = 1.0 if self.order == "max" else -1.0
        raw = [_score(r, self.attribute) for r in records]
        # A record without a usable score ranks last whatever the order.
        return [s if s == -math.inf else sign * s for s in raw]

    def ranking(self, records: Sequence[CheckpointRecord]) -> list[int]:
        """Indices of ``records`` from best to worst."""
        scores = self.scores(records)
        return sorted(
            range(len(records)),
            key=lambda i: (scores[i], records[i].report_index),
            reverse=True,
        )

    def should_keep(self, records: Sequence[CheckpointRecord]) -> list[bool]:
        kept = set(self.ranking(records)[: self.n])
        return [i in kept for i in range(len(records))]


def make_policy(
    num_to_keep: int | None, score_attribute: str | None, score_order: Literal["max", "min"]
) -> RetentionPolicy:
    if num_to_keep is None:
        return KeepAll()
    if score_attribute is None:
        return KeepLatest(num_to_keep)
    return KeepBest(num_to_keep, score_attribute, score_order)


def decide_retention(
    policy: RetentionPolicy,
    records: Sequence[CheckpointRecord],
    *,
    protected: Sequence[str | None] = (),
) -> list[bool]:
    """The policy's decision, with the latest record and ``protected`` names always kept."""
    keep = policy.should_keep(records)
    if records:
        latest = max(range(len(records)), key=lambda i: records[i].report_index)
        keep[latest] = True
    protected_names = {name for name in protected if name}
    return [k or r.dir_name in protected_names for k, r in zip(keep, records, strict=True)]


def best_first(
    records: Sequence[CheckpointRecord],
    score_attribute: str | None,
    score_order: Literal["max", "min"],
) -> list[CheckpointRecord]:
    """Records ordered best first (latest first without a score attribute)."""
    if score_attribute is None:
        return sorted(records, key=lambda r: r.report_index, reverse=True)
    policy = KeepBest(len(records), score_attribute, score_order)
    return [records[i] for i in policy.ranking(records)]
