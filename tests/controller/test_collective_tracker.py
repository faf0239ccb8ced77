"""The controller side of cairn.collective, as pure logic."""

from __future__ import annotations

import pickle

from cairn._src.controller.collective_service import CollectiveTracker
from cairn._src.errors import CollectiveTimeoutError, ReportError
from cairn._src.wire.messages import (
    BARRIER,
    BROADCAST,
    CollectiveMessage,
    CollectiveReleaseMessage,
)


def test_releases_every_rank_once_all_arrived_with_rank_zeros_data() -> None:
    tracker = CollectiveTracker(3)
    assert tracker.on_arrive(CollectiveMessage(2, 1, BROADCAST, 0), now=0.0) == []
    assert tracker.on_arrive(CollectiveMessage(0, 1, BROADCAST, 0, b"data"), now=1.0) == []
    releases = tracker.on_arrive(CollectiveMessage(1, 1, BROADCAST, 0), now=2.0)
    assert releases == [(r, CollectiveReleaseMessage(1, b"data")) for r in range(3)]
    assert tracker.check(done=[], timeout_s=1.0, now=100.0) is None


def test_timeout_names_the_missing_ranks() -> None:
    tracker = CollectiveTracker(4)
    tracker.on_arrive(CollectiveMessage(0, 1, BARRIER, 2), now=10.0)
    tracker.on_arrive(CollectiveMessage(2, 1, BARRIER, 2), now=11.0)
    assert tracker.check(done=[], timeout_s=5.0, now=14.0) is None
    problem = tracker.check(done=[], timeout_s=5.0, now=15.5)
    assert problem is not None and problem.rank == 1 and not problem.fatal
    assert isinstance(problem.error, CollectiveTimeoutError)
    assert problem.summary.startswith("CollectiveTimeoutError: ranks 1, 3 did not reach "
                                      "barrier() (collective call 1) within 5s of ranks 0, 2")


def test_a_rank_that_finished_without_arriving_is_a_fatal_problem() -> None:
    tracker = CollectiveTracker(2)
    tracker.on_arrive(CollectiveMessage(0, 1, BARRIER, 0), now=0.0)
    problem = tracker.check(done=[1], timeout_s=100.0, now=1.0)
    assert problem is not None and problem.fatal and problem.rank == 1
    assert "rank 1 finished without calling barrier() (collective call 1)" in problem.summary


def test_different_calls_and_different_report_counts_are_fatal() -> None:
    tracker = CollectiveTracker(2)
    tracker.on_arrive(CollectiveMessage(0, 1, BARRIER, 0))
    assert tracker.on_arrive(CollectiveMessage(1, 1, BROADCAST, 0)) == []
    problem = tracker.check(done=[], timeout_s=100.0)
    assert problem is not None and problem.fatal
    assert ("Collective call 1 differs between ranks: rank 0 called barrier(), rank 1 called "
            "broadcast_from_rank_zero()") in problem.summary

    tracker = CollectiveTracker(2)
    tracker.on_arrive(CollectiveMessage(0, 1, BARRIER, 3))
    tracker.on_arrive(CollectiveMessage(1, 1, BARRIER, 2))
    problem = tracker.check(done=[], timeout_s=100.0)
    assert problem is not None and problem.fatal
    assert "after different numbers of report() calls (rank 0 after 3, rank 1 after 2)" in (
        problem.summary)


def test_messages_and_errors_pickle() -> None:
    message = CollectiveMessage(0, 1, BROADCAST, 0, b"x")
    assert pickle.loads(pickle.dumps(message)) == message
    error = ReportError("x")
    assert str(pickle.loads(pickle.dumps(error))) == "x"
