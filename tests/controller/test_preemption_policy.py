"""Preemption's pure parts: FailureConfig's arguments, the two budgets, the merged info and
one attempt's deadline (the real processes are in tests/fault/test_preemption.py)."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

import cairn
from cairn import ConfigError, FailureConfig, PreemptionError, PreemptionInfo
from cairn._src.controller.failure_policy import AttemptFailure, FailureDecision, FailurePolicy
from cairn._src.controller.preemption import AttemptPreemption
from cairn._src.controller.worker_failures import WorkerFailure, describe_lost
from cairn._src.wire.preemption import PreemptionNoticeMessage, merge_preemption_info

RETRY, RAISE = FailureDecision.RETRY, FailureDecision.RAISE


def test_ray_defaults() -> None:
    config = FailureConfig()
    assert config.max_preemption_failures == -1
    assert config.preemption_grace_s == 0.0
    assert config.relax_collectives_on_preemption is False
    assert config.preemption_deadline_s == 120.0


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"max_preemption_failures": -2},
     r"FailureConfig.max_preemption_failures=-2 must be an integer >= 0 or -1"),
    ({"max_preemption_failures": 1.5},
     r"FailureConfig.max_preemption_failures=1.5 must be an integer >= 0"),
    ({"max_preemption_failures": True},
     r"FailureConfig.max_preemption_failures=True must be an integer >= 0"),
    ({"preemption_grace_s": -1.0},
     r"FailureConfig.preemption_grace_s=-1.0 must be a number >= 0 \(seconds past the "
     r"reclaim deadline\)"),
    ({"preemption_grace_s": "10"}, r"FailureConfig.preemption_grace_s='10' must be a number"),
    ({"preemption_grace_s": float("inf")}, r"FailureConfig.preemption_grace_s=inf must be"),
    ({"preemption_deadline_s": 0}, r"FailureConfig.preemption_deadline_s=0 must be a number > 0"),
    ({"relax_collectives_on_preemption": "yes"},
     r"FailureConfig.relax_collectives_on_preemption='yes' must be True or False"),
])
def test_bad_arguments_name_the_field_and_what_is_accepted(kwargs: dict[str, Any],
                                                           message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        FailureConfig(**kwargs)


INFO = PreemptionInfo(deadline_ms=None, preempted_node_to_ranks={"local": [0, 1]})


@pytest.mark.parametrize(("max_preemptions", "so_far", "expected"),
                         [(0, 0, RAISE), (1, 0, RETRY), (1, 1, RAISE), (-1, 10_000, RETRY)])
def test_preemptions_have_their_own_budget(max_preemptions: int, so_far: int,
                                           expected: FailureDecision) -> None:
    # max_failures=0 would fail an ordinary failure at once: a preemption does not use it.
    policy = FailurePolicy(0, max_preemptions)
    failure = AttemptFailure(ranks=(0, 1), reason="reclaimed", preemption=INFO)
    assert policy.decide(failure, so_far) is expected
    assert policy.decide(AttemptFailure(ranks=(0,), reason="boom"), 0) is RAISE


def test_merged_info_covers_every_node_and_the_earliest_deadline() -> None:
    a = PreemptionInfo(deadline_ms=None, preempted_node_to_ranks={"n1": [0, 1]})
    b = PreemptionInfo(deadline_ms=5000, preempted_node_to_ranks={"n2": [3, 2]})
    c = PreemptionInfo(deadline_ms=4000, preempted_node_to_ranks={"n1": [1]})
    merged = merge_preemption_info(merge_preemption_info(a, b), c)
    assert merged.deadline_ms == 4000
    assert merged.preempted_node_ids == ["n1", "n2"]
    assert merged.preempted_ranks == [0, 1, 2, 3]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    def wait(self, objects: list[Any], timeout: float) -> list[Any]:
        return []


def test_an_attempt_maps_a_notice_to_its_node_and_keeps_the_deadline() -> None:
    clock = FakeClock()
    preemption = AttemptPreemption([(0, "a"), (1, "a"), (2, "b")],
                                   FailureConfig(preemption_deadline_s=30.0,
                                                 preemption_grace_s=5.0), clock)
    assert preemption.info is None and not preemption.deadline_passed()
    info = preemption.on_notice(PreemptionNoticeMessage(1, None, "SIGTERM"))
    assert info is not None and info.preempted_node_to_ranks == {"a": [0, 1]}
    # A second notice from the same node says nothing new.
    assert preemption.on_notice(PreemptionNoticeMessage(0, None, "SIGTERM")) is None
    assert preemption.deadline_t() == 1035.0  # 30 s without a deadline, plus 5 s grace
    clock.now = 1034.9
    assert not preemption.deadline_passed()
    clock.now = 1035.0
    assert preemption.deadline_passed()
    # A drain of node b with a deadline before that one moves it earlier.
    merged = preemption.on_notice(PreemptionNoticeMessage(2, 1_010_000, "drain"))
    assert merged is not None and merged.preempted_ranks == [0, 1, 2]
    assert preemption.deadline_t() == 1015.0


def test_a_death_during_a_notice_is_the_preemption_a_raise_alone_is_not() -> None:
    preemption = AttemptPreemption([(0, "a"), (1, "a")], FailureConfig(), FakeClock())
    died = WorkerFailure(rank=1, summary="Worker rank 1 was killed by SIGKILL", traceback="",
                         went=True)
    raised = WorkerFailure(rank=0, summary="ValueError: x", traceback="Traceback ...",
                           exception=b"x")
    assert not preemption.caused([died])  # no notice: an ordinary failure
    preemption.on_notice(PreemptionNoticeMessage(0, None, "SIGTERM"))
    assert preemption.caused([died, raised])
    assert not preemption.caused([raised])


def test_a_rank_whose_connection_ended_went_whether_or_not_it_was_reaped_yet() -> None:
    # Both ranks killed at once: their closed connections can end the attempt before
    # either exit watcher fires, and a dying process (Ray's actor, a GPU process) may be
    # reaped well after its socket closed: either way the rank went.
    preemption = AttemptPreemption([(0, "a"), (1, "a")], FailureConfig(), FakeClock())
    preemption.on_notice(PreemptionNoticeMessage(1, None, "SIGTERM"))
    workers = [_Worker(0, exits=True), _Worker(1, exits=False)]
    lost = [describe_lost(w, w.wait_exit(0)) for w in workers]  # type: ignore[arg-type]
    assert all(f.went for f in lost) and "killed by SIGKILL" in lost[0].summary
    assert "closed its connection" in lost[1].summary
    assert preemption.caused(lost[:1]) and preemption.caused(lost[1:])


def test_a_rank_that_went_on_a_node_without_a_notice_is_an_ordinary_failure() -> None:
    # Node b is drained; rank 0 on node a crashes meanwhile: counted as a failure, so a
    # crash loop cannot hide in the preemption budget during a drain.
    preemption = AttemptPreemption([(0, "a"), (1, "b")], FailureConfig(), FakeClock())
    preemption.on_notice(PreemptionNoticeMessage(1, None, "drain"))
    crashed = WorkerFailure(rank=0, summary="Worker rank 0 was killed by SIGSEGV",
                            traceback="", went=True)
    reclaimed = WorkerFailure(rank=1, summary="Worker rank 1 was killed by SIGKILL",
                              traceback="", went=True)
    assert not preemption.caused([crashed])
    assert preemption.caused([crashed, reclaimed])


class _Worker:
    def __init__(self, rank: int, *, exits: bool) -> None:
        self.rank, self.pid, self._exits = rank, 100 + rank, exits

    def wait_exit(self, timeout_s: float) -> bool:
        return self._exits

    def describe_exit(self) -> str:
        return "was killed by SIGKILL"


def test_preemption_error_pickles_and_says_what_ray_says() -> None:
    error = PreemptionError(INFO, drain_timed_out=True, detail="the deadline passed",
                            run_path="/runs/r", worker_failures={0: ValueError("x")})
    assert str(error).startswith("Training was interrupted by node preemption "
                                 "(preempted_ranks=[0, 1], drain_timed_out=True)")
    copy = pickle.loads(pickle.dumps(error))
    assert copy.preemption_info == INFO and copy.drain_timed_out
    assert isinstance(copy, cairn.TrainingFailedError) and str(copy) == str(error)


def test_get_preemption_info_outside_a_worker_says_where_to_call_it() -> None:
    with pytest.raises(cairn.ReportError, match=r"cairn.get_preemption_info\(\) was called "
                                                r"outside a Cairn worker"):
        cairn.get_preemption_info()


def test_relaxed_collectives_are_accepted_and_the_notice_says_they_do_nothing(
        caplog: pytest.LogCaptureFixture) -> None:
    preemption = AttemptPreemption([(0, "a")], FailureConfig(
        relax_collectives_on_preemption=True), FakeClock())
    with caplog.at_level("WARNING", logger="cairn._src.controller.preemption"):
        preemption.on_notice(PreemptionNoticeMessage(0, None, "SIGTERM"))
    assert "relax_collectives_on_preemption=True) has no effect in Cairn" in caplog.text
