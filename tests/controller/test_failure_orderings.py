"""How an attempt's failure is classified and counted, whichever of a rank's exit, the end
of its connection and its last messages the controller sees first (stepped with fakes:
each ordering is forced, no processes)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from controller_fakes import FakeWorker, Harness, make_harness

from cairn import FailureConfig
from cairn._src.controller.connections import LAST_MESSAGE_GRACE_S, LOST_EXIT_GRACE_S
from cairn._src.controller.state import ControllerState
from cairn._src.run.layout import EVENTS_DIR
from cairn._src.run.segment_log import read_log
from cairn._src.wire.messages import DoneMessage, ErrorMessage, StoppedMessage
from cairn._src.wire.preemption import PreemptionMessage, PreemptionNoticeMessage

S = ControllerState


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def build(**options: Any) -> Harness:
        harness = make_harness(tmp_path / str(len(made)), **options)
        made.append(harness)
        return harness

    yield build
    for harness in made:
        harness.close()


def _running(harness: Harness) -> list[FakeWorker]:
    assert harness.controller.step().new is S.STARTING
    workers = harness.backend.groups[-1]
    for worker in workers:
        harness.connect(worker)
    assert harness.controller.step().new is S.RUNNING
    return workers


def _peer(worker: FakeWorker) -> Any:
    assert worker.peer is not None
    return worker.peer


def _notice(worker: FakeWorker) -> None:
    _peer(worker).send(PreemptionNoticeMessage(worker.rank, None, "SIGTERM"))


def _counts(harness: Harness) -> tuple[int, int]:
    index = harness.manager.index
    return index.preemptions, index.failures


@pytest.mark.parametrize("order", ["exit first", "connection first, reaped late"])
def test_ranks_killed_after_a_notice_are_a_preemption_in_either_order(make, order) -> None:
    harness = make(failure_config=FailureConfig(max_failures=0))
    workers = _running(harness)
    _notice(workers[0])
    for worker in workers:
        if order == "exit first":
            worker.end()
        else:  # the socket is closed; the process cannot be reaped yet
            _peer(worker).close()
    assert harness.controller.step().new is S.RESTARTING
    assert _counts(harness) == (1, 0)


@pytest.mark.parametrize("order", ["exit first", "connection first"])
def test_ranks_lost_with_a_preempted_ray_node_are_a_preemption_in_either_order(
        make, order) -> None:
    harness = make(failure_config=FailureConfig(max_failures=0))
    workers = _running(harness)
    for worker in workers:
        worker.preempted = True
    for worker in workers:
        if order == "exit first":
            worker.end()
        else:
            worker.exited = True  # reapable, but its exit watcher fires later
            _peer(worker).close()
    assert harness.controller.step().new is S.RESTARTING
    assert _counts(harness) == (1, 0)


def test_a_crash_off_the_noticed_node_counts_as_a_failure(make) -> None:
    harness = make(failure_config=FailureConfig(max_failures=0, max_preemption_failures=-1))
    start = harness.backend.start

    def on_two_nodes(*args: Any, **kwargs: Any) -> list[FakeWorker]:
        group = start(*args, **kwargs)
        group[1].node_id = "node-b"
        return group

    harness.backend.start = on_two_nodes  # type: ignore[method-assign]
    workers = _running(harness)
    _notice(workers[1])  # node-b (rank 1 only) is drained
    workers[0].end()  # rank 0, elsewhere, crashes meanwhile
    assert harness.controller.step().new is S.ERRORED
    assert _counts(harness) == (0, 1)


def _during_stop(harness: Harness, act: Callable[[], None]) -> None:
    """Run ``act`` right after the controller killed the failed ranks (as the kept ranks
    are told to stop)."""
    kill_ranks = harness.backend.kill_ranks

    def then(ranks: set[int]) -> None:
        kill_ranks(ranks)
        if not getattr(then, "done", False):
            then.done = True  # type: ignore[attr-defined]
            act()

    harness.backend.kill_ranks = then  # type: ignore[method-assign]


def test_a_kept_rank_that_dies_right_after_it_stopped_restarts_the_whole_group(make) -> None:
    harness = make(max_failures=1, keep_survivors=True)
    workers = _running(harness)
    workers[1].end()

    def stopped_then_died() -> None:
        _peer(workers[0]).send(StoppedMessage(0, 0))
        workers[0].end()

    _during_stop(harness, stopped_then_died)
    assert harness.controller.step().new is S.RESTARTING
    assert harness.controller._kept is None and harness.backend.kills == 1


def test_a_kept_rank_whose_own_error_arrives_as_it_stops_is_not_kept(make) -> None:
    harness = make(max_failures=1, keep_survivors=True, workers=3)
    workers = _running(harness)
    workers[1].end()

    def own_error() -> None:
        _peer(workers[0]).send(ErrorMessage(
            0, "RuntimeError", "CUDA error: an illegal memory access was encountered",
            "Traceback ...\nRuntimeError: CUDA error", None, False))
        _peer(workers[0]).send(StoppedMessage(0, 0))
        _peer(workers[2]).send(StoppedMessage(2, 0))

    _during_stop(harness, own_error)
    assert harness.controller.step().new is S.RESTARTING
    # Two ranks failed on their own: the whole group restarts.
    assert harness.controller._kept is None and harness.backend.kills == 1


def test_a_rank_that_returns_as_the_others_stop_is_replaced_and_the_rest_kept(make) -> None:
    harness = make(max_failures=1, keep_survivors=True, workers=3)
    workers = _running(harness)
    workers[1].end()

    def returned() -> None:
        _peer(workers[2]).send(DoneMessage(2, 0, None))
        workers[2].end()
        _peer(workers[0]).send(StoppedMessage(0, 0))

    _during_stop(harness, returned)
    assert harness.controller.step().new is S.RESTARTING
    kept = harness.controller._kept
    assert kept is not None and set(kept.connections) == {0} and kept.replace == {1, 2}
    assert harness.backend.killed_ranks == [{1}, {2}] and harness.backend.kills == 0


def test_ranks_on_a_noticed_node_are_never_kept(make) -> None:
    # Every rank is on the one machine the notice names: none can be kept, so the next
    # attempt starts afresh (and its ranks hear of a notice again from their new node).
    harness = make(failure_config=FailureConfig(max_failures=0, keep_survivors=True),
                   keep_survivors=True)
    workers = _running(harness)
    _notice(workers[0])
    workers[1].end()
    _peer(workers[0]).send(StoppedMessage(0, 0))  # it would stop if asked
    assert harness.controller.step().new is S.RESTARTING
    assert _counts(harness) == (1, 0)
    assert harness.controller._kept is None and harness.backend.kills == 1
    assert any(isinstance(m, PreemptionMessage) for m in _until_closed(workers[0]))


def _until_closed(worker: FakeWorker) -> list[object]:
    messages = []
    try:
        while _peer(worker).poll():
            messages.append(_peer(worker).recv())
    except EOFError:
        pass
    return messages


def test_a_rank_reaped_after_the_failure_grace_still_counts_as_gone(make) -> None:
    harness = make(workers=3, failure_config=FailureConfig(max_failures=0))
    workers = _running(harness)
    _notice(workers[0])
    dying = workers[1]

    def reaped_late(timeout_s: float) -> bool:
        if not dying.exited:  # the watcher fires in a later turn
            dying.exited = True
            os.write(dying._exit_w, b"x")
        return False

    dying.wait_exit = reaped_late  # type: ignore[method-assign]
    _peer(dying).close()
    assert harness.controller.step().new is S.RESTARTING
    assert _counts(harness) == (1, 0)


def test_a_rank_that_returned_is_done_when_its_done_trails_the_exit(make) -> None:
    # Ray reports a returned actor task on its own channel: under load its Done came
    # more than LAST_MESSAGE_GRACE_S after, and the run failed with "exited with code 0".
    harness = make(failure_config=FailureConfig(max_failures=0))
    workers = _running(harness)
    for worker in workers:
        worker.last_message_may_trail = True
        worker.exit_seen()

    def done_late() -> None:
        for worker in workers:
            _peer(worker).send(DoneMessage(worker.rank, 0, None))
            _peer(worker).close()

    harness.clock.after(LAST_MESSAGE_GRACE_S + 0.5, done_late)
    assert harness.controller.step().new is S.FINISHING
    assert _counts(harness) == (0, 0)


def test_a_killed_rank_without_a_last_message_fails_within_the_short_grace(make) -> None:
    harness = make(failure_config=FailureConfig(max_failures=0))
    workers = _running(harness)
    workers[1].exit_seen()  # killed: no Done will come, its connection stays silent
    assert harness.controller.step().new is S.ERRORED
    assert _counts(harness) == (0, 1)


def test_the_error_of_a_rank_that_returned_is_its_failure_when_it_trails_the_exit(
        make) -> None:
    harness = make(failure_config=FailureConfig(max_failures=0))
    workers = _running(harness)
    workers[1].last_message_may_trail = True
    workers[1].exit_seen()

    def error_late() -> None:
        _peer(workers[1]).send(ErrorMessage(1, "ValueError", "bad batch", "Traceback ...",
                                            None, False))
        _peer(workers[1]).close()

    harness.clock.after(LAST_MESSAGE_GRACE_S + 0.5, error_late)
    assert harness.controller.step().new is S.ERRORED
    outcome = harness.controller.outcome
    assert outcome is not None and "bad batch" in str(outcome.error)
    assert "exited with code" not in str(outcome.error)


def test_ranks_lost_together_wait_out_one_grace_for_their_last_messages(make) -> None:
    # A lost node's ranks exit at once and their connections go silent (no end arrives):
    # their last messages are awaited together, not one grace after another, and on the
    # controller's clock like its every other wait.
    harness = make(workers=4, failure_config=FailureConfig(max_failures=0))
    workers = _running(harness)
    for worker in workers[1:]:
        worker.exit_seen()
    started = harness.clock.now
    assert harness.controller.step().new is S.ERRORED
    assert LAST_MESSAGE_GRACE_S <= harness.clock.now - started < 2 * LAST_MESSAGE_GRACE_S
    assert _counts(harness) == (0, 1)


def _failure_errors(harness: Harness) -> str:
    harness.events.flush()
    failure = [e for e in read_log(harness.manager.run.join(EVENTS_DIR), harness.manager.retry)
               if e["type"] == "failure"][-1]
    return json.dumps(failure["errors"])


def test_ranks_whose_connections_end_before_their_exits_await_them_together(make) -> None:
    # A dying process closes its sockets a moment before it can be reaped: each rank's
    # failure says how its process ended, and the ranks of a lost node wait for their
    # exits together, on the controller's clock (one after another, in real time, the
    # loop stood still for each).
    harness = make(workers=4, failure_config=FailureConfig(max_failures=0))
    workers = _running(harness)
    for worker in workers[1:]:
        _peer(worker).close()
    harness.clock.after(LOST_EXIT_GRACE_S / 2,
                        lambda: [worker.exit_seen() for worker in workers[1:]])
    started = harness.clock.now
    assert harness.controller.step().new is S.ERRORED
    assert harness.clock.now - started < LOST_EXIT_GRACE_S
    errors = _failure_errors(harness)
    for rank in (1, 2, 3):
        assert f"Worker rank {rank} (pid {10_000 + rank}) exited with code 1" in errors
    assert "closed its connection" not in errors


def test_a_rank_whose_exit_never_comes_fails_after_one_short_wait(make) -> None:
    # A node lost on Ray: its actor's socket ends at once, its death comes seconds later.
    harness = make(workers=3, failure_config=FailureConfig(max_failures=0))
    workers = _running(harness)
    _peer(workers[2]).close()
    started = harness.clock.now
    assert harness.controller.step().new is S.ERRORED
    assert LOST_EXIT_GRACE_S <= harness.clock.now - started < 2 * LOST_EXIT_GRACE_S
    assert ("Worker rank 2 (pid 10002) closed its connection to the controller"
            in _failure_errors(harness))


def test_a_ray_preemption_flag_that_comes_after_the_connection_end_still_counts(make) -> None:
    # A node drained faster than the workers' drain poll: no notice; the actor's socket
    # ends at once, and Ray says RayActorError(preempted=True) only with the actor's death,
    # which the stop of the group waits for.
    harness = make(failure_config=FailureConfig(max_failures=0))
    workers = _running(harness)
    lost = workers[1]
    killed = harness.backend.kill

    def kill() -> None:
        killed()
        lost.preempted = True
        lost.exit_seen()

    harness.backend.kill = kill  # type: ignore[method-assign]
    _peer(lost).close()
    assert harness.controller.step().new is S.RESTARTING
    assert _counts(harness) == (1, 0)
    assert "preemption_notice" in harness.event_types()


@pytest.mark.parametrize("order", ["exit first", "connection first"])
def test_a_kept_rank_that_dies_while_stopping_is_a_failure_in_either_order(
        make, order) -> None:
    harness = make(max_failures=1, keep_survivors=True, workers=3)
    workers = _running(harness)
    workers[1].end()

    def one_stops_one_dies() -> None:
        _peer(workers[0]).send(StoppedMessage(0, 0))
        if order == "exit first":  # its connection has not ended yet
            workers[2].exit_seen()
        else:
            _peer(workers[2]).close()

    _during_stop(harness, one_stops_one_dies)
    assert harness.controller.step().new is S.RESTARTING
    # Two ranks failed on their own: the whole group restarts, and both are on record.
    assert harness.controller._kept is None and harness.backend.kills == 1
    harness.events.flush()
    failure = [e for e in read_log(harness.manager.run.join(EVENTS_DIR), harness.manager.retry)
               if e["type"] == "failure"][-1]
    assert "Worker rank 2 (pid 10002)" in json.dumps(failure["errors"]), failure


def test_a_kept_rank_lost_while_stopping_says_how_its_process_ended(make) -> None:
    # The stop ends at once on the second cause, before the lost rank's exit is read: the
    # failure recorded afterwards still says how the process ended, once it is known.
    harness = make(max_failures=1, keep_survivors=True, workers=3)
    workers = _running(harness)
    workers[1].end()
    dying, looks = workers[2], []

    def reaped_just_after_its_connection_ended(timeout_s: float) -> bool:
        looks.append(timeout_s)
        return len(looks) > 1

    def one_stops_one_is_lost() -> None:
        _peer(workers[0]).send(StoppedMessage(0, 0))
        dying.wait_exit = reaped_just_after_its_connection_ended  # type: ignore[method-assign]
        _peer(dying).close()

    _during_stop(harness, one_stops_one_is_lost)
    assert harness.controller.step().new is S.RESTARTING
    assert harness.controller._kept is None
    errors = _failure_errors(harness)
    assert "Worker rank 2 (pid 10002) exited with code 1" in errors
    assert "closed its connection" not in errors


def test_a_kept_rank_whose_exit_trails_its_connection_while_stopping_is_awaited(
        make) -> None:
    # Rank 2's connection ends as it stops, its exit comes a moment later: the stop waits
    # for it (as the attempt's own loop does), so the record says how the process ended
    # whichever came first, instead of that it closed its connection.
    harness = make(max_failures=1, keep_survivors=True, workers=3)
    workers = _running(harness)
    workers[1].end()

    def one_stops_one_is_lost() -> None:
        _peer(workers[0]).send(StoppedMessage(0, 0))
        _peer(workers[2]).close()
        harness.clock.after(LOST_EXIT_GRACE_S / 2, workers[2].exit_seen)

    _during_stop(harness, one_stops_one_is_lost)
    assert harness.controller.step().new is S.RESTARTING
    assert harness.controller._kept is None
    errors = _failure_errors(harness)
    assert "Worker rank 2 (pid 10002) exited with code 1" in errors
    assert "closed its connection" not in errors


def test_a_rank_whose_exit_never_came_is_not_described_by_the_kill_that_ends_it(make) -> None:
    # Its connection closed, its exit did not come within the wait: the controller then
    # kills it to replace it, and that exit (the fakes' kill ends the worker) is Cairn's
    # own doing, not how the rank ended.
    harness = make(max_failures=1, keep_survivors=True, workers=3)
    workers = _running(harness)
    _peer(workers[2]).close()
    _during_stop(harness, lambda: [_peer(w).send(StoppedMessage(w.rank, 0))
                                   for w in workers[:2]])
    assert harness.controller.step().new is S.RESTARTING
    assert harness.controller._kept is not None and workers[2].exited
    errors = _failure_errors(harness)
    assert "Worker rank 2 (pid 10002) closed its connection to the controller" in errors
    assert "exited with code" not in errors


def _nodes(harness: Harness, *nodes: str) -> None:
    """The next group's ranks run on ``nodes`` (rank i on nodes[i])."""
    start = harness.backend.start

    def placed(*args: Any, **kwargs: Any) -> list[FakeWorker]:
        group = start(*args, **kwargs)
        for worker, node in zip(group, nodes, strict=True):
            worker.node_id = node
        return group

    harness.backend.start = placed  # type: ignore[method-assign]


def test_a_crash_while_another_node_is_noticed_stays_a_failure_when_survivors_are_kept(
        make) -> None:
    # Rank 2's node is noticed; rank 1, elsewhere, crashes. Rank 2 is replaced (a noticed
    # rank is never kept), and the controller's own kill of it is no preemption.
    harness = make(failure_config=FailureConfig(max_failures=0, keep_survivors=True),
                   keep_survivors=True, workers=3)
    _nodes(harness, "node-0", "node-0", "node-b")
    workers = _running(harness)
    _notice(workers[2])
    workers[1].end()
    _during_stop(harness, lambda: _peer(workers[0]).send(StoppedMessage(0, 0)))
    assert harness.controller.step().new is S.ERRORED
    assert _counts(harness) == (0, 1)


def test_a_noticed_rank_replaced_beside_a_crash_is_no_failure_and_the_others_are_kept(
        make) -> None:
    # Rank 2's node is noticed, rank 1 crashes: rank 2 is killed to be replaced, and the
    # end of its connection (Cairn's own kill) is neither a second cause that restarts the
    # whole group nor a failure of rank 2 in the attempt's record.
    harness = make(failure_config=FailureConfig(max_failures=1, keep_survivors=True),
                   keep_survivors=True, workers=3)
    _nodes(harness, "node-0", "node-0", "node-b")
    workers = _running(harness)
    _notice(workers[2])
    workers[1].end()
    _during_stop(harness, lambda: _peer(workers[0]).send(StoppedMessage(0, 0)))
    assert harness.controller.step().new is S.RESTARTING
    kept = harness.controller._kept
    assert kept is not None and set(kept.connections) == {0} and kept.replace == {1, 2}
    errors = _failure_errors(harness)
    assert "Worker rank 1" in errors and "Worker rank 2" not in errors


def test_ranks_of_a_node_whose_deadline_passed_are_replaced_and_the_others_kept(
        make) -> None:
    # Ranks 1 and 2 share the noticed node; its reclaim deadline passes with them still
    # running. Cairn kills both to replace them: neither kill is a failure, so rank 0,
    # elsewhere, is kept, and the attempt counts as a preemption.
    harness = make(failure_config=FailureConfig(max_failures=0, keep_survivors=True,
                                                preemption_deadline_s=30.0),
                   keep_survivors=True, workers=3)
    _nodes(harness, "node-a", "node-b", "node-b")
    workers = _running(harness)
    _notice(workers[1])
    _during_stop(harness, lambda: _peer(workers[0]).send(StoppedMessage(0, 0)))
    assert harness.controller.step().new is S.RESTARTING
    kept = harness.controller._kept
    assert kept is not None and set(kept.connections) == {0} and kept.replace == {1, 2}
    assert _counts(harness) == (1, 0)
    assert "Worker rank" not in _failure_errors(harness)


def test_a_rank_on_a_node_ray_says_was_preempted_is_not_kept(make) -> None:
    # Ranks 1 and 2 share node-b. Rank 1's connection ends before Ray's preempted flag,
    # which comes with its actor's death (its kill waits for it): rank 2 is replaced too.
    harness = make(failure_config=FailureConfig(max_failures=0, keep_survivors=True),
                   keep_survivors=True, workers=3)
    _nodes(harness, "node-a", "node-b", "node-b")
    workers = _running(harness)
    kill_ranks = harness.backend.kill_ranks

    def flagged(ranks: set[int]) -> None:
        kill_ranks(ranks)
        for worker in workers:
            if worker.rank in ranks:
                worker.preempted = True

    harness.backend.kill_ranks = flagged  # type: ignore[method-assign]
    _peer(workers[1]).close()

    def both_stop() -> None:
        _peer(workers[0]).send(StoppedMessage(0, 0))
        _peer(workers[2]).send(StoppedMessage(2, 0))

    _during_stop(harness, both_stop)
    assert harness.controller.step().new is S.RESTARTING
    assert _counts(harness) == (1, 0)
    kept = harness.controller._kept
    assert kept is not None and set(kept.connections) == {0} and kept.replace == {1, 2}


def test_a_kept_rank_that_fails_while_stopping_ends_the_stop_at_once(make) -> None:
    # Rank 2 dies as it stops; rank 0 would take stop_timeout_s to stop. The whole group
    # restarts either way: the stop does not wait for rank 0.
    harness = make(max_failures=1, keep_survivors=True, workers=3)
    workers = _running(harness)
    workers[1].end()
    _during_stop(harness, workers[2].end)
    started = harness.clock.now
    assert harness.controller.step().new is S.RESTARTING
    assert harness.controller._kept is None and harness.backend.kills == 1
    stop_timeout_s = FailureConfig().stop_timeout_s
    assert harness.clock.now - started < stop_timeout_s


def test_a_kept_rank_whose_collective_lost_the_failed_peer_is_still_kept(make) -> None:
    # Rank 0's all_reduce fails when rank 1 dies; that error is no second cause: the stop
    # waits for rank 0 to stop, and it is kept.
    harness = make(max_failures=1, keep_survivors=True)
    workers = _running(harness)
    workers[1].end()

    def collective_lost_then_stopped() -> None:
        _peer(workers[0]).send(ErrorMessage(
            0, "DistBackendError", "Connection closed by peer [127.0.0.1]:29500",
            "Traceback ...\nDistBackendError: Connection closed by peer", None, False))
        harness.clock.after(1.5, lambda: _peer(workers[0]).send(StoppedMessage(0, 0)))

    _during_stop(harness, collective_lost_then_stopped)
    assert harness.controller.step().new is S.RESTARTING
    kept = harness.controller._kept
    assert kept is not None and set(kept.connections) == {0} and kept.replace == {1}
