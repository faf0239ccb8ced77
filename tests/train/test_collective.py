"""cairn.collective.barrier() and broadcast_from_rank_zero() with real worker processes."""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import pytest
import v2_workloads

import cairn
from cairn import FailureConfig, ScalingConfig, Trainer, TrainingFailedError
from cairn.collective import barrier, broadcast_from_rank_zero

RunConfigFactory = Callable[..., cairn.RunConfig]


@pytest.mark.parametrize("num_workers", [2, 4])
def test_barrier_and_broadcast(num_workers: int, run_config: RunConfigFactory,
                               scratch: str) -> None:
    result = Trainer(v2_workloads.barrier_and_broadcast, train_loop_config={"scratch": scratch},
                     scaling_config=ScalingConfig(num_workers=num_workers),
                     run_config=run_config()).fit()
    assert result.return_value == {"seed": 1234, "from": 0}
    for rank in range(num_workers):
        with open(os.path.join(scratch, f"received_{rank}.json")) as f:
            assert json.load(f) == {"seed": 1234, "from": 0}


def test_a_barrier_one_rank_never_reaches_times_out_naming_it(
    run_config: RunConfigFactory,
) -> None:
    config = run_config(failure_config=FailureConfig(collective_timeout_s=2.0))
    with pytest.raises(TrainingFailedError,
                       match=r"\[rank 1\] CollectiveTimeoutError: rank 1 did not reach barrier\(\) "
                             r"\(collective call 1\) within 2s of ranks 0, 2: every rank must "
                             r"make the same collective calls "
                             r"\(FailureConfig.collective_timeout_s\)") as info:
        Trainer(v2_workloads.barrier_one_rank_never_reaches,
                scaling_config=ScalingConfig(num_workers=3), run_config=config).fit()
    assert isinstance(info.value, cairn.WorkerGroupError)


@pytest.mark.parametrize(
    ("workload", "message"),
    [
        (v2_workloads.broadcast_unpicklable,
         r"broadcast_from_rank_zero\(data=\{'lock': <unlocked _thread.lock object at .*>\}\) "
         r"cannot be pickled \(TypeError: cannot pickle '_thread.lock' object\)"),
        (v2_workloads.mismatched_collectives,
         r"Collective call 1 differs between ranks: rank 0 called barrier\(\), rank 1 called "
         r"broadcast_from_rank_zero\(\)"),
        (v2_workloads.barrier_after_different_report_counts,
         r"Ranks reached barrier\(\) \(collective call 1\) after different numbers of report\(\) "
         r"calls \(rank 0 after 1, rank 1 after 0\)"),
        (v2_workloads.barrier_then_finish_early,
         r"rank 1 finished without calling barrier\(\) \(collective call 1\), which rank 0 "
         r"called"),
    ],
)
def test_misuse_fails_the_run_at_once_with_a_clear_error(
    workload: Callable[..., None], message: str, run_config: RunConfigFactory
) -> None:
    config = run_config(failure_config=FailureConfig(max_failures=2))
    with pytest.raises(TrainingFailedError, match=message):
        Trainer(workload, scaling_config=ScalingConfig(num_workers=2), run_config=config).fit()
    # Mistakes in the training code: not retried.
    assert cairn.Result.from_path(os.path.join(os.fspath(config.storage_path), "run")
                                  ).goodput.attempts == 1


def test_outside_a_worker() -> None:
    with pytest.raises(cairn.ReportError, match=r"cairn.collective.barrier\(\) was called "
                                                r"outside a Cairn worker"):
        barrier()
    with pytest.raises(cairn.ReportError, match=r"broadcast_from_rank_zero\(\) was called"):
        broadcast_from_rank_zero(1)
