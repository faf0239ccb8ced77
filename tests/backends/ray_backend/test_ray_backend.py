"""The Ray backend: the same runtime and contract with workers as Ray actors."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import pytest

ray = pytest.importorskip("ray")

import ray_workloads  # noqa: E402

import cairn  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def local_ray_cluster() -> Iterator[None]:
    # address="local": a Ray instance of its own, even where another cluster runs here.
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_fit_on_ray_actors(run_config: Callable[..., cairn.RunConfig]) -> None:
    result = cairn.Trainer(
        ray_workloads.train, train_loop_config={"steps": 3},
        scaling_config=cairn.ScalingConfig(num_workers=2, backend="ray"),
        run_config=run_config(),
    ).fit()
    assert result.return_value == {"start": 0, "local_rank": 0, "local_world_size": 2,
                                   "attempts_here": [0]}
    assert result.metrics == {"step": 2}
    assert result.checkpoint is not None
    result.checkpoint.verify()


def test_actor_death_restarts_and_resumes(run_config: Callable[..., cairn.RunConfig]) -> None:
    result = cairn.Trainer(
        ray_workloads.train, train_loop_config={"steps": 4, "crash_at": 1},
        scaling_config=cairn.ScalingConfig(num_workers=2, backend="ray"),
        run_config=run_config(failure_config=cairn.FailureConfig(max_failures=1)),
    ).fit()
    # Rank 1 exited right after report 2 (step 1) returned: resumed from it, not before.
    assert result.return_value["start"] == 2
    assert result.goodput.failures == 1
    # The whole group restarted: rank 0 ran attempt 1 in a new actor.
    assert result.return_value["attempts_here"] == [1]


def test_keep_survivors_keeps_the_surviving_actor_on_ray(
    run_config: Callable[..., cairn.RunConfig], caplog: pytest.LogCaptureFixture,
) -> None:
    # Only rank 1's actor is replaced, in its bundle of the placement group; rank 0 runs
    # attempt 1 in the actor (the process) that ran attempt 0.
    with caplog.at_level(logging.INFO, logger="cairn"):
        result = cairn.Trainer(
            ray_workloads.train, train_loop_config={"steps": 4, "crash_at": 1},
            scaling_config=cairn.ScalingConfig(num_workers=2, backend="ray"),
            run_config=run_config(failure_config=cairn.FailureConfig(
                max_failures=1, keep_survivors=True)),
        ).fit()
    assert result.return_value["start"] == 2
    assert result.return_value["attempts_here"] == [0, 1]
    assert result.goodput.failures == 1
    assert "kept ranks [0], replacing [1]" in caplog.text
    assert "Replaced the Ray workers of ranks [1]" in caplog.text


@pytest.mark.parametrize("worker_env", [None, {"CAIRN_TEST_VAR": "x"}])
def test_actors_get_cairn_variables_without_a_runtime_environment(
    run_config: Callable[..., cairn.RunConfig], worker_env: dict[str, str] | None,
) -> None:
    # Cairn's own variables (and the attempt's) are set by the actor as its run starts: an
    # actor with a runtime environment never runs in a worker process Ray prestarted. Only
    # RunConfig.worker_env, meant for the process's start, travels in one.
    names = ["CAIRN_WORKER", "CAIRN_WORLD_SIZE", "CAIRN_RANK", "CAIRN_TEST_VAR"]
    result = cairn.Trainer(
        ray_workloads.environment, train_loop_config={"names": names},
        scaling_config=cairn.ScalingConfig(num_workers=2, backend="ray"),
        run_config=run_config(worker_env=worker_env),
    ).fit()
    seen = result.return_value
    assert seen["runtime_env_vars"] == (worker_env or {})
    assert seen["environ"] == {"CAIRN_WORKER": "1", "CAIRN_WORLD_SIZE": "2", "CAIRN_RANK": "0",
                               "CAIRN_TEST_VAR": (worker_env or {}).get("CAIRN_TEST_VAR")}
    assert seen["pythonpath_set"]


def test_warm_standby_runs_the_next_attempt_in_spare_actors(
    run_config: Callable[..., cairn.RunConfig],
) -> None:
    # FailureConfig(warm_standby=True) on Ray: spare actors start at the first report and
    # preload CAIRN_PRELOAD; after rank 1's exit the next attempt runs in them.
    result = cairn.Trainer(
        ray_workloads.standby,
        scaling_config=cairn.ScalingConfig(num_workers=2, backend="ray"),
        run_config=run_config(worker_env={"CAIRN_PRELOAD": "standby_marker"},
                              failure_config=cairn.FailureConfig(max_failures=1,
                                                                 warm_standby=True)),
    ).fit()
    assert result.goodput.failures == 1
    assert result.return_value["attempt"] == 1
    assert result.return_value["preloaded"] is True
