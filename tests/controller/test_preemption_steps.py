"""Preemption in the controller, stepped with fakes and a fake clock (no processes): the
notice reaches every rank, the deadline ends the attempt, and a preemption draws on its
own budget."""

from __future__ import annotations

from pathlib import Path

from controller_fakes import FakeWorker, Harness, make_harness

from cairn import FailureConfig, PreemptionError
from cairn._src.controller.state import ControllerState
from cairn._src.wire.preemption import PreemptionMessage, PreemptionNoticeMessage

S = ControllerState


def _running(harness: Harness) -> list[FakeWorker]:
    assert harness.controller.step().new is S.STARTING
    workers = harness.backend.groups[-1]
    for worker in workers:
        harness.connect(worker)
    assert harness.controller.step().new is S.RUNNING
    return workers


def _received(worker: FakeWorker) -> list[object]:
    """What the controller sent ``worker`` before it closed the connection."""
    assert worker.peer is not None
    messages = []
    while worker.peer.poll():
        try:
            messages.append(worker.peer.recv())
        except EOFError:
            break
    return messages


def _notice(worker: FakeWorker) -> None:
    assert worker.peer is not None
    worker.peer.send(PreemptionNoticeMessage(worker.rank, None, "SIGTERM"))


def test_the_deadline_restarts_the_group_as_a_preemption(tmp_path: Path) -> None:
    harness = make_harness(tmp_path, failure_config=FailureConfig(
        max_failures=0, preemption_deadline_s=30.0, preemption_grace_s=5.0))
    try:
        workers = _running(harness)
        _notice(workers[1])
        noticed = harness.clock.now
        change = harness.controller.step()
        assert (change.old, change.new) == (S.RUNNING, S.RESTARTING)
        assert "reclaim deadline" in change.reason
        assert harness.clock.now >= noticed + 35.0  # the deadline, plus the grace
        for worker in workers:
            sent = [m for m in _received(worker) if isinstance(m, PreemptionMessage)]
            assert [m.info.preempted_node_to_ranks for m in sent] == [{"node-0": [0, 1]}]
        index = harness.manager.index
        assert (index.preemptions, index.failures) == (1, 0)
        assert harness.event_types()[-2:] == ["preemption_notice", "failure"]
    finally:
        harness.close()


def test_a_spent_preemption_budget_ends_the_run_with_preemption_error(tmp_path: Path) -> None:
    harness = make_harness(tmp_path, failure_config=FailureConfig(max_failures=5,
                                                                  max_preemption_failures=0))
    try:
        workers = _running(harness)
        _notice(workers[0])
        workers[0].end()  # the node is reclaimed
        change = harness.controller.step()
        assert (change.old, change.new) == (S.RUNNING, S.ERRORED)
        outcome = harness.controller.outcome
        assert outcome is not None and isinstance(outcome.error, PreemptionError)
        assert not outcome.error.drain_timed_out
        assert outcome.error.preemption_info.preempted_ranks == [0, 1]
    finally:
        harness.close()


def test_an_error_with_no_worker_gone_is_an_ordinary_failure(tmp_path: Path) -> None:
    harness = make_harness(tmp_path, failure_config=FailureConfig(max_failures=1))
    try:
        workers = _running(harness)
        _notice(workers[0])
        harness.error(workers[1])
        assert harness.controller.step().new is S.RESTARTING
        index = harness.manager.index
        assert (index.preemptions, index.failures) == (0, 1)
    finally:
        harness.close()
