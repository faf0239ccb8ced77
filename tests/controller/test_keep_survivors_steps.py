"""FailureConfig(keep_survivors=True), stepped with fakes: when one rank fails the others
are stopped and kept, only the failed rank is replaced, and the kept ranks are told to
rejoin; every fallback restarts the whole group."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from controller_fakes import FakeWorker, Harness, ReplacingFakeBackend, make_harness

from cairn._src.controller.state import ControllerState
from cairn._src.controller.survivors import (
    KeptRanks,
    plan_restores,
    plan_survivors,
    planned_source,
)
from cairn._src.controller.worker_failures import WorkerFailure
from cairn._src.wire.messages import (
    DoneMessage,
    ErrorMessage,
    MemoryCopyInfo,
    RejoinMessage,
    RestorePlan,
    SetupMessage,
    StopMessage,
    StoppedMessage,
)

S = ControllerState


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def build(**options: object) -> Harness:
        harness = make_harness(tmp_path / str(len(made)), **options)  # type: ignore[arg-type]
        made.append(harness)
        return harness

    yield build
    for harness in made:
        harness.close()


def _start(harness: Harness) -> list[FakeWorker]:
    harness.controller.step()
    workers = harness.backend.groups[-1]
    for worker in workers:
        harness.connect(worker)
    assert harness.controller.step().new is S.RUNNING
    return workers


def _of(messages: list[object], kind: type) -> list[object]:
    return [m for m in messages if isinstance(m, kind)]


def test_a_dead_rank_is_replaced_and_the_stopped_survivor_rejoins(make) -> None:
    harness = make(max_failures=1, keep_survivors=True)
    backend = harness.backend
    assert isinstance(backend, ReplacingFakeBackend)
    first = _start(harness)
    harness.received(first[0])
    first[1].end()
    assert first[0].peer is not None
    first[0].peer.send(StoppedMessage(0, 0))  # its train function ended, it waits
    assert harness.controller.step().new is S.RESTARTING
    assert _of(harness.received(first[0]), StopMessage) == [
        StopMessage(0, "[rank 1] Worker rank 1 (pid 10001) exited with code 1")]
    assert backend.killed_ranks == [{1}] and backend.kills == 0
    assert harness.controller.step().new is S.STARTING
    assert backend.replaced == [{1}]
    second = backend.groups[-1]
    assert second[0] is first[0] and second[1] is not first[1]
    rejoin = _of(_until_closed(first[0]), RejoinMessage)
    assert [m.attempt for m in rejoin] == [1]  # type: ignore[attr-defined]
    # The kept rank connects again for attempt 1, the replacement for the first time.
    for worker in second:
        harness.connect(worker, attempt=1)
    assert harness.controller.step().new is S.RUNNING
    setups = _of(harness.received(second[0]), SetupMessage)
    assert [s.attempt for s in setups] == [1]  # type: ignore[attr-defined]
    assert setups[0].keep_survivors  # type: ignore[attr-defined]
    starts = [e for e in harness.event_types() if e == "attempt_start"]
    assert len(starts) == 2


def test_a_rank_that_returned_is_replaced_with_the_failed_one_not_waited_for(
        make, caplog: pytest.LogCaptureFixture) -> None:
    # Rank 2's train function returned (Done; its process is on its way out) before rank
    # 1 died: it cannot be stopped and kept, so it is replaced too, while rank 0 is kept.
    harness = make(max_failures=1, keep_survivors=True, workers=3)
    backend = harness.backend
    first = _start(harness)
    assert first[2].peer is not None and first[0].peer is not None
    first[2].peer.send(DoneMessage(2, 0, None))
    first[1].end()
    first[0].peer.send(StoppedMessage(0, 0))
    with caplog.at_level(logging.WARNING):
        assert harness.controller.step().new is S.RESTARTING
    assert "did not stop" not in caplog.text
    assert backend.killed_ranks == [{1, 2}] and backend.kills == 0
    assert _of(harness.received(first[0]), StopMessage)
    assert harness.controller.step().new is S.STARTING
    assert backend.replaced == [{1, 2}]
    assert backend.groups[-1][0] is first[0]


@pytest.mark.parametrize("error", ["ManifestError", "NotARegularFileError",
                                   "MissingCheckpointFileError", "ChecksumMismatchError"])
def test_a_rank_that_failed_on_damage_makes_the_whole_group_restart(make, error) -> None:
    # Any kind of damage: the checkpoint the survivors hold may be the damaged one.
    harness = make(max_failures=1, keep_survivors=True, workers=3)
    first = _start(harness)
    assert first[1].peer is not None
    first[1].peer.send(ErrorMessage(1, error, "checkpoint_000002 is damaged", "", None,
                                    False))
    first[1].end()
    for kept in (first[0], first[2]):
        assert kept.peer is not None
        kept.peer.send(StoppedMessage(kept.rank, 0))
    assert harness.controller.step().new is S.RESTARTING
    assert harness.controller._kept is None and harness.backend.kills == 1


def _until_closed(worker: FakeWorker) -> list[object]:
    """What the controller sent on a connection it then closed."""
    assert worker.peer is not None
    messages = []
    try:
        while worker.peer.poll():
            messages.append(worker.peer.recv())
    except EOFError:
        pass
    return messages


def test_a_survivor_that_does_not_stop_makes_the_whole_group_restart(make) -> None:
    harness = make(max_failures=1, keep_survivors=True)
    first = _start(harness)
    first[1].end()
    assert harness.controller.step().new is S.RESTARTING  # after stop_timeout_s (fake time)
    assert _of(_until_closed(first[0]), StopMessage)
    assert harness.backend.kills == 1
    harness.controller.step()
    assert harness.backend.replaced == []  # type: ignore[attr-defined]
    assert harness.backend.groups[-1][0] is not first[0]


def test_two_ranks_failing_at_once_restart_the_whole_group(make) -> None:
    harness = make(workers=3, max_failures=1, keep_survivors=True)
    first = _start(harness)
    first[1].end()
    first[2].end()
    assert harness.controller.step().new is S.RESTARTING
    assert _of(_until_closed(first[0]), StopMessage) == []
    assert harness.backend.kills == 1


def test_a_fatal_error_never_keeps_survivors(make) -> None:
    harness = make(max_failures=1, keep_survivors=True)
    first = _start(harness)
    harness.error(first[1], fatal=True)
    assert harness.controller.step().new is S.ERRORED
    assert _of(_until_closed(first[0]), StopMessage) == []


def test_a_backend_that_refuses_for_this_run_restarts_the_whole_group(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="cairn"):
        harness = make_harness(tmp_path, max_failures=1, keep_survivors=True,
                               replace_refusal="the group is elastic")
    try:
        assert ("FailureConfig(keep_survivors=True) does not apply to this run: the group "
                "is elastic") in caplog.text
        first = _start(harness)
        first[1].end()
        assert harness.controller.step().new is S.RESTARTING
        assert harness.backend.kills == 1  # the whole group, no rank stopped and kept
        assert harness.controller.step().new is S.STARTING
        backend = harness.backend
        assert isinstance(backend, ReplacingFakeBackend) and backend.replaced == []
        second = backend.groups[-1]
        for worker in second:
            harness.connect(worker)
        assert harness.controller.step().new is S.RUNNING
        setup = _of(harness.received(second[0]), SetupMessage)
        assert setup and not setup[0].keep_survivors  # type: ignore[attr-defined]
    finally:
        harness.close()


def _failure(rank: int, summary: str, traceback: str = "tb") -> WorkerFailure:
    return WorkerFailure(rank=rank, summary=summary, traceback=traceback)


def test_the_plan_keeps_ranks_whose_error_is_a_lost_peer() -> None:
    plan = plan_survivors(
        enabled=True, can_replace=True, ranks=[0, 1, 2], exited={1}, connected={0, 1, 2},
        fatal=False, failures=[_failure(1, "Worker rank 1 (pid 9) was killed", ""),
                               _failure(0, "RuntimeError: Connection closed by peer")])
    assert (plan.keep, plan.replace) == ({0, 2}, {1})


@pytest.mark.parametrize(("options", "reason"), [
    ({"enabled": False}, "keep_survivors=False"),
    ({"can_replace": False}, "cannot replace"),
    ({"fatal": True}, "fatal"),
    ({"connected": {0}}, "not every rank had connected"),
    ({"failures": [_failure(0, "ValueError: a"), _failure(1, "ValueError: b")]},
     "2 ranks failed at once"),
    ({"exited": {0, 1}}, "no rank is left"),
])
def test_the_plan_restarts_the_whole_group(options: dict[str, object], reason: str) -> None:
    arguments: dict[str, object] = {
        "enabled": True, "can_replace": True, "ranks": [0, 1], "exited": set(),
        "connected": {0, 1}, "fatal": False, "failures": [_failure(1, "ValueError: x")]}
    plan = plan_survivors(**{**arguments, **options})  # type: ignore[arg-type]
    assert plan.keep == frozenset() and plan.replace == {0, 1}
    assert reason in plan.reason


def test_keep_survivors_must_be_a_bool() -> None:
    import cairn

    with pytest.raises(cairn.ConfigError, match=r"FailureConfig.keep_survivors='yes' must be "
                                                r"True or False"):
        cairn.FailureConfig(keep_survivors="yes")  # type: ignore[arg-type]
    with pytest.raises(cairn.ConfigError, match=r"FailureConfig\.stop_timeout_s"):
        cairn.FailureConfig(stop_timeout_s=0)



def _kept(copies: dict[int, MemoryCopyInfo | None], replace: set[int]) -> KeptRanks:
    return KeptRanks({}, frozenset(replace), copies)


def test_the_restore_plan_uses_memory_then_peers_then_storage() -> None:
    held = MemoryCopyInfo(4, ("127.0.0.1", 5000))
    plans = plan_restores(4, _kept({0: held, 2: None}, {1}), 3)
    assert plans[0] == RestorePlan(4, True, (), "its own memory copy")
    assert plans[1].peers == ((0, "127.0.0.1", 5000),) and not plans[1].own_memory
    assert plans[1].reason == "a replaced rank; from peer rank 0"
    assert plans[2].reason == "it holds no snapshot in memory; from peer rank 0"
    assert [planned_source(plans[r]) for r in range(3)] == [
        ("memory", None), ("peer", 0), ("peer", 0)]


def test_the_restore_plan_gives_a_rank_without_a_copy_its_own_files_from_the_driver(
) -> None:
    held = MemoryCopyInfo(4, ("127.0.0.1", 5000))
    files = {0: {"rank_0/rank_state.pt": b"0"}, 1: {"rank_1/rank_state.pt": b"1"}}
    plans = plan_restores(4, _kept({0: held}, {1}), 2, files)
    # Its own memory copy holds its files; those of the replaced rank only the driver.
    assert plans[0].driver_files == {"rank_1/rank_state.pt": b"1"}
    assert plans[0].reason == ("its own memory copy; 1 small files of replaced ranks from "
                               "the driver")
    assert plans[1].driver_files == {"rank_1/rank_state.pt": b"1"}
    assert plans[1].reason == ("a replaced rank; from peer rank 0; 1 small files of its own "
                               "from the driver")
    # No kept rank holds the checkpoint: the driver's files first, then storage.
    stale = MemoryCopyInfo(3, ("127.0.0.1", 5000))
    plans = plan_restores(4, _kept({0: stale}, {1}), 2, files)
    assert planned_source(plans[1]) == ("driver", None)
    assert plans[1].driver_files == {"rank_1/rank_state.pt": b"1"}
    # Its copy is stale: its own files, and the replaced rank's.
    assert plans[0].driver_files == {"rank_0/rank_state.pt": b"0", "rank_1/rank_state.pt": b"1"}


def test_the_restore_plan_reads_storage_when_no_copy_is_the_latest() -> None:
    stale = MemoryCopyInfo(3, ("127.0.0.1", 5000))
    plans = plan_restores(4, _kept({0: stale}, {1}), 2)
    assert plans[0].reason == ("its memory copy is of report 3; no kept rank holds report 4 "
                               "in memory")
    assert planned_source(plans[1]) == ("storage", None)
    # A whole-group restart, or nothing to resume: no plan (every rank reads storage).
    assert plan_restores(4, None, 2) == {} and plan_restores(None, _kept({}, {1}), 2) == {}


def test_the_restore_plan_counts_a_copy_whose_commit_the_rank_had_not_heard_of() -> None:
    # Rank 0 stopped while report 4's commit was in flight (its copy still pending there);
    # the commit then completed, and the attempt resumes from report 4: rank 0 holds it
    # (the commit's notice reaches it before the next attempt), so nobody reads storage.
    info = MemoryCopyInfo(3, ("127.0.0.1", 5000), pending=(4,))
    plans = plan_restores(4, _kept({0: info}, {1}), 2)
    assert plans[0].own_memory and plans[0].reason == "its own memory copy"
    assert plans[1].peers == ((0, "127.0.0.1", 5000),)
    # Only a pending copy, none committed yet: the same.
    only = MemoryCopyInfo(-1, ("127.0.0.1", 5000), pending=(4,))
    assert plan_restores(4, _kept({0: only}, {1}), 2)[0].own_memory
    # A pending copy of another report than the one resumed from counts for nothing.
    plans = plan_restores(3, _kept({0: only}, {1}), 2)
    assert not plans[0].own_memory
    assert plans[0].reason == ("it holds no memory copy of report 3; no kept rank holds "
                               "report 3 in memory")


def test_a_rank_still_in_its_set_up_is_not_kept() -> None:
    # Rank 0 waits in the process group's rendezvous for rank 1, which died before it
    # joined: no stop reaches it there, so the whole group restarts at once instead of
    # waiting stop_timeout_s for it.
    arguments: dict[str, object] = {
        "enabled": True, "can_replace": True, "ranks": [0, 1, 2], "exited": {1},
        "connected": {0, 1, 2}, "fatal": False,
        "failures": [_failure(1, "Worker rank 1 (pid 9) was killed", "")]}
    plan = plan_survivors(**arguments, started={2})  # type: ignore[arg-type]
    assert plan.keep == frozenset() and plan.replace == {0, 1, 2}
    assert "ranks [0] had not reached their train function" in plan.reason
    assert plan_survivors(**arguments, started={0, 2}).keep == {0, 2}  # type: ignore[arg-type]
