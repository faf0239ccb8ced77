"""Retention policies: which committed checkpoints to keep.

Policies are pure: they look at the committed records and return one keep/drop decision
per record. The checkpoint manager acts on the decision (index first, deletion after).
Whatever a policy says, the latest committed checkpoint and the one the current attempt
resumed from are kept: :func:`decide_retention` enforces that on top of any policy. The one
the attempt resumed from is protected only until a newer checkpoint of that attempt commits
(:func:`resume_protection`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from cairn._src.checkpoint.index import CheckpointRecord, Retention, RunIndex
from cairn._src.run.report_checks import rankable, score_value


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


def score_of(record: CheckpointRecord, attribute: str) -> float | None:
    """The record's ``attribute`` (a flat key, else ``/`` reaching into nested metrics, as
    report() checked it and Result reads it) as a number, or None when it has no usable
    one (missing, not a number, NaN): what ranks it last. An infinite score is a score:
    ``-inf`` is the best loss there is."""
    return rankable(score_value(record.metrics, attribute))


@dataclass(frozen=True)
class KeepBest:
    """Keep the ``n`` checkpoints with the best score; ties go to the later report."""

    n: int
    attribute: str
    order: Literal["max", "min"] = "max"

    def ranking(self, records: Sequence[CheckpointRecord]) -> list[int]:
        """Indices of ``records`` from best to worst; a record without a usable score
        (NaN, which report() accepts, or one planted in the index) ranks last whatever the
        order, below ``-inf`` too, the later report first among them, as Ray Train's
        checkpoint manager ranks NaN. The same ranking before and after a driver restart:
        the index keeps NaN and the infinities as JSON's ``NaN``/``Infinity``, read back as
        the same floats."""
        sign = 1.0 if self.order == "max" else -1.0
        scores = [score_of(r, self.attribute) for r in records]
        return sorted(
            range(len(records)),
            key=lambda i: (scores[i] is not None, sign * (scores[i] or 0.0),
                           records[i].report_index),
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


def resume_protection(records: Sequence[CheckpointRecord], index: RunIndex) -> str | None:
    """The checkpoint retention protects as the one the run's current attempt resumed from.

    The index's last attempt (numbered ``index.attempts - 1``) resumed from
    ``index.resumed_from``. That checkpoint is protected until a checkpoint reported after
    it commits in that attempt (one of ``records``); then this returns None. From then on
    a restart resumes from the newer one and every rank's ``get_checkpoint()`` answers it,
    so the older one stays only if the policy keeps it, as in Ray Train (whose
    persistence test counts the checkpoints during an attempt).
    """
    resumed_from = index.resumed_from
    if resumed_from is None:
        return None
    resumed = next((r for r in records if r.dir_name == resumed_from), None)
    if resumed is None:
        return resumed_from
    current = index.attempts - 1
    if any(r.attempt == current and r.report_index > resumed.report_index for r in records):
        return None
    return resumed_from


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


def split_by_retention(
    policy: RetentionPolicy,
    records: Sequence[CheckpointRecord],
    *,
    protected: Sequence[str | None] = (),
) -> tuple[tuple[CheckpointRecord, ...], tuple[CheckpointRecord, ...]]:
    """``records`` split by :func:`decide_retention`: (kept, dropped), each in order."""
    keep = decide_retention(policy, records, protected=protected)
    kept = tuple(r for r, k in zip(records, keep, strict=True) if k)
    dropped = tuple(r for r, k in zip(records, keep, strict=True) if not k)
    return kept, dropped


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


@dataclass(frozen=True)
class KeepReason:
    """Why retention keeps a checkpoint: a stable ``code`` for programs and a ``text`` for
    people.

    Codes: ``all`` (no ``num_to_keep``), ``best`` (among the best N by score),
    ``latest_n`` (among the latest N, without a score), ``latest`` (the latest committed
    checkpoint), ``resumed_from`` (the one the run's current attempt resumed from) and
    ``pending_validation`` (its validation has not finished).
    """

    code: str
    text: str

    def as_dict(self) -> dict[str, str]:
        return {"code": self.code, "text": self.text}


def retention_reasons(
    records: Sequence[CheckpointRecord],
    retention: Retention,
    *,
    resumed_from: str | None = None,
    pending: Collection[str] = (),
) -> list[tuple[KeepReason, ...]]:
    """Why each of ``records`` is kept under ``retention``: one tuple per record, in the
    same order, empty for a record retention drops.

    A record is kept (its tuple is not empty) exactly when :func:`decide_retention` of the
    same policy keeps it with ``resumed_from`` and ``pending`` protected, as the driver and
    ``cairn prune`` decide. Pure: it reads only its arguments.
    """
    n, attribute = retention.num_to_keep, retention.score_attribute
    order: Literal["max", "min"] = "min" if retention.score_order == "min" else "max"
    reasons: list[list[KeepReason]] = [[] for _ in records]
    pending_names = set(pending)
    # A checkpoint whose validation is pending takes no place (its score may change).
    ranked = [i for i, r in enumerate(records) if r.dir_name not in pending_names]
    if n is None:
        for found in reasons:
            found.append(KeepReason("all", "every checkpoint is kept (no num_to_keep)"))
    elif attribute is None:
        by_recency = sorted(ranked, key=lambda i: records[i].report_index, reverse=True)
        for place, i in enumerate(by_recency[:n], start=1):
            reasons[i].append(KeepReason("latest_n", f"#{place} of the latest {n}"))
    else:
        best = KeepBest(n, attribute, order)
        order_of = best.ranking([records[i] for i in ranked])
        for place, i in enumerate([ranked[j] for j in order_of][: best.n], start=1):
            text = f"#{place} of the best {n} by {attribute} ({order})"
            if score_of(records[i], attribute) is None:
                text += f", though it has no {attribute}"
            reasons[i].append(KeepReason("best", text))
    if records:
        latest = max(range(len(records)), key=lambda i: records[i].report_index)
        reasons[latest].append(KeepReason("latest", "the latest checkpoint"))
    for record, found in zip(records, reasons, strict=True):
        if resumed_from and record.dir_name == resumed_from:
            found.append(KeepReason("resumed_from", "the run's last attempt resumed from it"))
        if record.dir_name in pending_names:
            found.append(KeepReason("pending_validation", "its validation is pending"))
    return [tuple(found) for found in reasons]


def ray_order(
    records: list[Any], score_attribute: str | None, score_order: str
) -> list[Any]:
    """Checkpoint records in Ray Train's ``best_checkpoints`` order: worst to best by the
    score attribute (ties: the earlier report first), report order without one."""
    return list(reversed(best_first(records, score_attribute,
                                    "min" if score_order == "min" else "max")))
