"""``barrier()`` and ``broadcast_from_rank_zero(data)``: the controller's side.

:class:`CollectiveTracker` (pure logic) gathers the ranks' calls, releases them all once
every rank arrived (with rank 0's data for a broadcast), and names what went wrong: ranks
that did not arrive within ``collective_timeout_s``, a rank that finished without
arriving, ranks that called different collectives, or ranks that arrived after different
numbers of ``report()`` calls. The worker's side is :mod:`cairn._src.worker.collectives`;
the messages are in :mod:`cairn._src.wire.messages`.

No torch is needed: the data travels pickled (cloudpickle) through the controller.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TypeVar

import cloudpickle

from cairn._src.controller.reports import describe_ranks
from cairn._src.controller.worker_failures import WorkerFailure
from cairn._src.errors import CollectiveTimeoutError, ReportError
from cairn._src.wire.messages import CollectiveMessage, CollectiveReleaseMessage

logger = logging.getLogger(__name__)

T = TypeVar("T")


# --- the controller side -----------------------------------------------------------------


@dataclass(frozen=True)
class CollectiveProblem:
    """Why an attempt cannot go on: ``rank`` is blamed; ``fatal`` means no restart."""

    rank: int
    error: BaseException
    fatal: bool

    @property
    def summary(self) -> str:
        return f"{type(self.error).__name__}: {self.error}"

    def as_failure(self) -> WorkerFailure:
        """The attempt failure blamed on ``rank``, with the error itself (it pickles)."""
        return WorkerFailure(rank=self.rank, summary=self.summary, traceback="",
                             exception=bytes(cloudpickle.dumps(self.error)))


@dataclass
class _Gathering:
    seq: int
    kind: str
    first_arrival: float
    kinds: dict[int, str] = field(default_factory=dict)
    reports: dict[int, int] = field(default_factory=dict)
    data: bytes | None = None


class CollectiveTracker:
    """Gathers the collective calls of one attempt. Not thread-safe: the controller loop
    owns it."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._open: dict[int, _Gathering] = {}
        self.problem: CollectiveProblem | None = None

    def on_arrive(self, message: CollectiveMessage,
                  now: float | None = None) -> list[tuple[int, CollectiveReleaseMessage]]:
        """Record a call; the releases to send (one per rank) once every rank arrived."""
        now = time.monotonic() if now is None else now
        gathering = self._open.get(message.seq)
        if gathering is None:
            gathering = self._open[message.seq] = _Gathering(message.seq, message.kind, now)
        gathering.kinds[message.rank] = message.kind
        gathering.reports[message.rank] = message.reports
        if message.rank == 0:
            gathering.data = message.data
        if self.problem is None:
            self.problem = self._check_agreement(gathering)
        if self.problem is not None or len(gathering.kinds) < self.world_size:
            return []
        del self._open[message.seq]
        release = CollectiveReleaseMessage(message.seq, gathering.data)
        return [(rank, release) for rank in range(self.world_size)]

    def waiting(self) -> set[int]:
        """The ranks inside a collective call, waiting for a release: until it comes they
        run nothing of their train function (so they cannot fail on their own)."""
        return {rank for gathering in self._open.values() for rank in gathering.kinds}

    def _check_agreement(self, gathering: _Gathering) -> CollectiveProblem | None:
        kinds = set(gathering.kinds.values())
        if len(kinds) > 1:
            by_kind = {k: sorted(r for r, v in gathering.kinds.items() if v == k) for k in kinds}
            detail = ", ".join(f"{describe_ranks(ranks)} called {kind}()"
                               for kind, ranks in sorted(by_kind.items(), key=lambda i: i[1]))
            return CollectiveProblem(min(gathering.kinds), ReportError(
                f"Collective call {gathering.seq} differs between ranks: {detail}. Every "
                "rank must call cairn.collective.barrier() and broadcast_from_rank_zero() in "
                "the same order."), fatal=True)
        counts = set(gathering.reports.values())
        if len(counts) > 1:
            detail = ", ".join(f"rank {r} after {c}" for r, c in sorted(gathering.reports.items()))
            return CollectiveProblem(min(gathering.reports), ReportError(
                f"Ranks reached {gathering.kind}() (collective call {gathering.seq}) after "
                f"different numbers of report() calls ({detail}). Every rank must call "
                "report() the same number of times between collective calls."), fatal=True)
        return None

    def check(self, done: Collection[int], timeout_s: float,
              now: float | None = None) -> CollectiveProblem | None:
        """The first problem: a disagreement, a rank that finished without arriving, or
        ranks that did not arrive within ``timeout_s`` of the first one."""
        if self.problem is not None:
            return self.problem
        now = time.monotonic() if now is None else now
        for seq in sorted(self._open):
            gathering = self._open[seq]
            arrived = sorted(gathering.kinds)
            missing = sorted(set(range(self.world_size)) - set(arrived))
            finished = sorted(set(missing) & set(done))
            if finished:
                return CollectiveProblem(finished[0], ReportError(
                    f"{describe_ranks(finished)} finished without calling {gathering.kind}() "
                    f"(collective call {seq}), which {describe_ranks(arrived)} called: every "
                    "rank must make the same collective calls."), fatal=True)
            if now - gathering.first_arrival > timeout_s:
                return CollectiveProblem(missing[0], CollectiveTimeoutError(
                    f"{describe_ranks(missing)} did not reach {gathering.kind}() (collective "
                    f"call {seq}) within {timeout_s:g}s of {describe_ranks(arrived)}: every "
                    "rank must make the same collective calls "
                    "(FailureConfig.collective_timeout_s)."), fatal=False)
        return None

