"""The controller, stepped one transition at a time with a fake backend and a fake clock
(no worker process): every transition of the state table and every way an attempt ends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from controller_fakes import FakeWorker, Harness, make_harness

from cairn._src.controller.attempt_loop import (
    FAILURE_GRACE_S,
    REPORT_GRACE_S,
    WORKER_START_TIMEOUT_S,
)
from cairn._src.controller.state import (
    ControllerState,
    StateMachine,
    Transition,
    allowed_transitions,
)
from cairn._src.errors import WorkerGroupError
from cairn._src.wire.messages import CollectiveMessage, ReportMessage, SetupMessage

S = ControllerState


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def build(**options: int) -> Harness:
        harness = make_harness(tmp_path / str(len(made)), **options)
        made.append(harness)
        return harness

    yield build
    for harness in made:
        harness.close()


def _start_and_connect(harness: Harness) -> list[FakeWorker]:
    assert harness.controller.step() == Transition(S.INITIALIZING, S.STARTING,
                                                   "starting a worker group")
    workers = harness.backend.groups[-1]
    for worker in workers:
        harness.connect(worker)
    change = harness.controller.step()
    assert (change.old, change.new) == (S.STARTING, S.RUNNING)
    return workers


def test_a_run_steps_from_initializing_to_finished(make) -> None:
    harness = make()
    workers = _start_and_connect(harness)
    for worker in workers:
        sent = harness.received(worker)
        assert sent[0][0] == "registrations"
        assert isinstance(sent[1], SetupMessage) and sent[1].rank == worker.rank
        assert sent[1].world_size == 2 and sent[1].attempt == 0
    harness.done(workers[0], value="the answer")
    harness.done(workers[1])
    assert harness.controller.step() == Transition(S.RUNNING, S.FINISHING,
                                                   "all workers finished")
    assert harness.controller.step() == Transition(S.FINISHING, S.FINISHED, "run complete")
    outcome = harness.controller.outcome
    assert outcome is not None and outcome.error is None
    assert outcome.return_value == "the answer"
    assert harness.backend.shutdowns == 1
    assert harness.manager.index.attempts == 1 and harness.manager.index.failures == 0
    assert harness.event_types() == ["session_start", "attempt_start", "workers_ready",
                                     "train_start", "train_end"]
    with pytest.raises(RuntimeError, match=r"state FINISHED: the run is over"):
        harness.controller.step()


def test_a_repeated_done_message_ends_training_once(make) -> None:
    harness = make()
    workers = _start_and_connect(harness)
    harness.done(workers[0])
    harness.done(workers[1])
    harness.done(workers[1])  # a worker's message read twice
    assert harness.controller.step() == Transition(S.RUNNING, S.FINISHING,
                                                   "all workers finished")
    assert harness.event_types().count("train_end") == 1


def test_a_worker_that_dies_restarts_the_group_until_the_budget_is_spent(make) -> None:
    harness = make(max_failures=1)
    workers = _start_and_connect(harness)
    workers[1].end()
    change = harness.controller.step()
    assert (change.old, change.new) == (S.RUNNING, S.RESTARTING)
    assert "rank 1" in change.reason and "exited with code 1" in change.reason
    assert harness.backend.kills == 1
    assert harness.manager.index.failures == 1
    assert harness.controller.step().new is S.STARTING
    assert harness.backend.bootstraps[-1].attempt == 1
    second = harness.backend.groups[-1]
    for worker in second:
        harness.connect(worker)
    assert harness.controller.step().new is S.RUNNING
    second[0].end()
    assert harness.controller.step() == Transition(S.RUNNING, S.ERRORED,
                                                   "failure budget spent")
    outcome = harness.controller.outcome
    assert outcome is not None and isinstance(outcome.error, WorkerGroupError)
    assert harness.manager.index.failures == 2
    assert harness.event_types().count("failure") == 2
    with pytest.raises(RuntimeError, match=r"state ERRORED"):
        harness.controller.step()


def test_a_fatal_error_ends_the_run_whatever_the_budget(make) -> None:
    harness = make(max_failures=-1)
    workers = _start_and_connect(harness)
    harness.error(workers[0], fatal=True)
    assert harness.controller.step() == Transition(S.RUNNING, S.ERRORED, "fatal error")


def test_an_error_message_fails_the_attempt_with_the_ranks_error(make) -> None:
    harness = make(max_failures=2)
    workers = _start_and_connect(harness)
    harness.error(workers[1])
    change = harness.controller.step()
    assert change.new is S.RESTARTING
    assert change.reason == "[rank 1] ValueError: boom"


def test_the_failure_grace_waits_for_the_other_ranks_errors(make) -> None:
    harness = make(max_failures=2, workers=3)
    workers = _start_and_connect(harness)
    failed = harness.clock.now
    workers[2].end()
    harness.error(workers[0])
    # Rank 1 neither failed nor exited: its error may still come, so the attempt ends
    # only once the grace has passed, with every error that arrived within it.
    change = harness.controller.step()
    assert change.new is S.RESTARTING
    assert harness.clock.now - failed >= FAILURE_GRACE_S
    assert change.reason == "[rank 0] ValueError: boom (and 1 more)"


def test_the_failure_grace_ends_once_every_rank_failed_or_exited(make) -> None:
    harness = make(max_failures=2)
    workers = _start_and_connect(harness)
    failed = harness.clock.now
    workers[1].end()
    harness.error(workers[0])  # the survivor's collective lost its peer, say
    # No rank is left whose error could still come: nothing to wait for.
    change = harness.controller.step()
    assert change.new is S.RESTARTING
    assert harness.clock.now - failed < FAILURE_GRACE_S
    assert change.reason == "[rank 0] ValueError: boom (and 1 more)"


def test_the_failure_grace_ends_once_the_other_ranks_wait_in_a_collective_call(make) -> None:
    harness = make(max_failures=2, workers=3)
    workers = _start_and_connect(harness)
    for worker in workers[:2]:  # ranks 0 and 1 reach a barrier that rank 2 never will
        assert worker.peer is not None
        worker.peer.send(CollectiveMessage(worker.rank, 1, "barrier", 0))
    failed = harness.clock.now
    workers[2].end()
    # Inside the barrier, ranks 0 and 1 run nothing that could fail: nothing to wait for.
    change = harness.controller.step()
    assert change.new is S.RESTARTING
    assert harness.clock.now - failed < FAILURE_GRACE_S
    assert change.reason.startswith("[rank 2] Worker rank 2")


def test_the_failure_grace_waits_for_a_rank_outside_the_collective_call(make) -> None:
    harness = make(max_failures=2, workers=3)
    workers = _start_and_connect(harness)
    assert workers[0].peer is not None
    workers[0].peer.send(CollectiveMessage(0, 1, "barrier", 0))
    failed = harness.clock.now
    workers[2].end()
    # Rank 1 still runs its train function: its error may still come.
    change = harness.controller.step()
    assert change.new is S.RESTARTING
    assert harness.clock.now - failed >= FAILURE_GRACE_S


def test_the_report_grace_waits_for_a_rank_that_has_not_connected_yet(make) -> None:
    # Rank 1 starts fast, reports three times and fails while rank 0 is still starting
    # (a loaded machine): rank 0 may still reach those reports once it connects, so the
    # attempt waits for it (at most the report grace) instead of ending at once.
    harness = make(max_failures=2)
    assert harness.controller.step().new is S.STARTING
    workers = harness.backend.groups[-1]
    harness.connect(workers[1])
    assert workers[1].peer is not None
    for index in (1, 2, 3):
        workers[1].peer.send(ReportMessage(1, index, {"step": index}, None, 0.0))
    failed = harness.clock.now
    harness.error(workers[1])
    change = harness.controller.step()
    assert change.new is S.RESTARTING
    assert harness.clock.now - failed >= REPORT_GRACE_S


def test_workers_that_never_connect_fail_the_attempt_after_the_start_timeout(make) -> None:
    harness = make(max_failures=0)
    assert harness.controller.step().new is S.STARTING
    start = harness.clock.now
    change = harness.controller.step()
    assert (change.old, change.new) == (S.STARTING, S.ERRORED)
    assert harness.clock.now - start > WORKER_START_TIMEOUT_S
    outcome = harness.controller.outcome
    assert outcome is not None
    assert "ranks 0, 1 did not connect to the controller" in str(outcome.error)


def test_a_worker_that_dies_before_the_others_connect_restarts_from_starting(make) -> None:
    harness = make(max_failures=1)
    assert harness.controller.step().new is S.STARTING
    first = harness.backend.groups[-1]
    harness.connect(first[0])
    first[1].end()
    change = harness.controller.step()
    assert (change.old, change.new) == (S.STARTING, S.RESTARTING)


def test_a_straggler_of_an_earlier_attempt_is_turned_away(make) -> None:
    harness = make()
    assert harness.controller.step().new is S.STARTING
    workers = harness.backend.groups[-1]
    stale = harness.connect(workers[0], attempt=7)
    for worker in workers:
        harness.connect(worker)
    assert harness.controller.step().new is S.RUNNING
    assert stale.closed
    attempt = harness.controller.attempt
    assert attempt is not None and attempt.connected == {0, 1}


def test_the_first_report_prepares_the_backends_standby_and_close_stops_it(make) -> None:
    harness = make()
    workers = _start_and_connect(harness)
    for worker in workers:
        assert worker.peer is not None
        worker.peer.send(ReportMessage(worker.rank, 1, {"loss": 1.0}, None, 0.0))
    for worker in workers:
        harness.done(worker)
    assert harness.controller.step().new is S.FINISHING
    assert harness.backend.standby_prepared == 1
    outcome_step = harness.controller.step()
    assert outcome_step.new is S.FINISHED
    outcome = harness.controller.outcome
    assert outcome is not None and outcome.last_metrics == {"loss": 1.0}
    assert harness.manager.index.next_report_index == 2
    harness.close()
    assert harness.backend.standby_stopped == 1


@pytest.mark.parametrize("state", list(ControllerState))
def test_the_state_table_allows_only_its_transitions(state: ControllerState) -> None:
    for new in ControllerState:
        machine = StateMachine()
        machine.state = state
        if new in allowed_transitions(state):
            assert machine.transition(new, "why") == Transition(state, new, "why")
            assert machine.state is new
        else:
            with pytest.raises(RuntimeError, match=f"{state.value} -> {new.value}"):
                machine.transition(new, "why")
            assert machine.state is state


def test_finished_and_errored_end_the_run() -> None:
    assert allowed_transitions(S.FINISHED) == frozenset()
    assert allowed_transitions(S.ERRORED) == frozenset()
