"""What the controller knows about one attempt of a worker group."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection

from cairn._src.backends.protocol import WorkerHandle
from cairn._src.checkpoint.views import CheckpointView
from cairn._src.controller.reports import ReportTracker
from cairn._src.controller.worker_failures import WorkerFailure, exit_summary
from cairn._src.wire.messages import DoneMessage


@dataclass
class Attempt:
    """One attempt's workers, connections, reports and failures (the controller loop's)."""

    number: int
    tracker: ReportTracker
    resume: CheckpointView | None
    first_report_index: int
    started_at: float
    workers: list[WorkerHandle] = field(default_factory=list)
    connections: dict[int, Connection] = field(default_factory=dict)
    connected: set[int] = field(default_factory=set)
    skipped_dirs: dict[int, str] = field(default_factory=dict)
    done: dict[int, DoneMessage] = field(default_factory=dict)
    failures: list[WorkerFailure] = field(default_factory=list)
    fatal: bool = False
    commits_in_flight: int = 0
    first_report_seen: bool = False
    train_started: bool = False
    # The ranks whose train function began (their set-up ended).
    started_ranks: set[int] = field(default_factory=set)
    announced_dirs: set[str] = field(default_factory=set)
    last_commit_t: float | None = None
    # A rank found the resume checkpoint damaged (see Controller._resume_found_damaged).
    resume_damaged: bool = False
    # Ranks whose connection ended before their exit was seen: until when (the loop's
    # clock) the exit is awaited, to say how the process ended (see
    # connections.LOST_EXIT_GRACE_S).
    exits_awaited: dict[int, float] = field(default_factory=dict)
    # Ranks the controller killed to replace them while others are kept (the failed
    # ranks, those on a noticed node): their exits and closed connections are its own
    # doing, no failure of theirs.
    replaced: set[int] = field(default_factory=set)

    def has_failure(self, rank: int) -> bool:
        return any(f.rank == rank for f in self.failures)

    def went_unexplained(self, rank: int) -> bool:
        """Whether a rank that exited or closed its connection went without a word: not
        done, no failure of its own recorded, and not killed by the controller."""
        return (rank not in self.done and not self.has_failure(rank)
                and rank not in self.replaced)

    def exit_awaited_until(self, now: float) -> float | None:
        """When the last exit still awaited is due; None when none is. A rank whose exit
        did not come by its time keeps the failure that says its connection closed,
        unless the exit is seen before the attempt's failure is recorded."""
        return max((due for due in self.exits_awaited.values() if due > now), default=None)

    def exits_seen(self, gone: list[WorkerHandle]) -> None:
        """Ranks whose exits were just seen: a failure recorded at the end of their
        connection, before the exit, now says how the process ended."""
        for worker in gone:
            if self.exits_awaited.pop(worker.rank, None) is None:
                continue
            self.failures = [replace(f, summary=exit_summary(worker))
                             if f.rank == worker.rank and f.went else f
                             for f in self.failures]

    def settle_exits(self) -> None:
        """Before the controller kills ranks: each rank whose exit was awaited and has come
        by now (after its time, or during the survivors' stop) says how its process
        ended; the others are awaited no more, since an exit after this is the kill's."""
        self.exits_seen([w for w in self.workers
                         if w.rank in self.exits_awaited and w.wait_exit(0)])
        self.exits_awaited.clear()


def placement(workers: list[WorkerHandle]) -> dict[int, tuple[int, int, int]]:
    """rank -> (local rank, local world size, node rank); nodes numbered by lowest rank."""
    by_node: dict[str, list[int]] = {}
    for worker in sorted(workers, key=lambda w: w.rank):
        by_node.setdefault(worker.node_id, []).append(worker.rank)
    result = {}
    for node_rank, ranks in enumerate(by_node.values()):
        for local_rank, rank in enumerate(ranks):
            result[rank] = (local_rank, len(ranks), node_rank)
    return result
