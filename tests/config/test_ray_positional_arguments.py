"""The configs take Ray Train 2.60's arguments by position, in Ray's order, so that a ported
``CheckpointConfig(2, "loss", "min")`` means what it means in Ray; arguments Ray removed
are refused by position as by keyword; Cairn's own arguments are keyword-only."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
from pathlib import Path
from typing import Any

import pytest

from cairn import (
    Callback,
    CheckpointConfig,
    ConfigDeprecationError,
    FailureConfig,
    RunConfig,
    ScalingConfig,
    ValidationConfig,
    ValidationTaskConfig,
)

# Ray Train 2.60's positional arguments (ray.train's classes), up to the first that Cairn
# does not support (ScalingConfig's label_selector, FailureConfig's
# controller_failure_limit, RunConfig's logging_config): a later one cannot be passed
# by position without it.
RAY_POSITIONAL = {
    ScalingConfig: ("trainer_resources", "num_workers", "use_gpu", "resources_per_worker",
                    "placement_strategy", "accelerator_type"),
    CheckpointConfig: ("num_to_keep", "checkpoint_score_attribute", "checkpoint_score_order",
                       "checkpoint_frequency", "checkpoint_at_end"),
    FailureConfig: ("max_failures", "fail_fast"),
    RunConfig: ("name", "storage_path", "storage_filesystem", "failure_config",
                "checkpoint_config", "callbacks", "worker_runtime_env"),
    ValidationTaskConfig: ("fn_kwargs", "timeout_s"),
    ValidationConfig: ("fn", "task_config", "ray_remote_kwargs"),
}


def _positional(cls: type) -> tuple[str, ...]:
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return tuple(name for name, parameter in inspect.signature(cls).parameters.items()
                 if parameter.kind in kinds)


def _validate(checkpoint: Any, **kwargs: Any) -> dict[str, Any]:
    return {}


@pytest.mark.parametrize("cls", list(RAY_POSITIONAL), ids=lambda c: c.__name__)
def test_the_positional_arguments_are_ray_s_and_only_ray_s(cls: type) -> None:
    assert _positional(cls) == RAY_POSITIONAL[cls]


@pytest.mark.parametrize("cls", list(RAY_POSITIONAL), ids=lambda c: c.__name__)
def test_the_positional_arguments_are_those_of_the_installed_ray_train(cls: type) -> None:
    ray_train = pytest.importorskip("ray.train")
    ray_names = _positional(getattr(ray_train, cls.__name__))
    ours = _positional(cls)
    assert ray_names[:len(ours)] == ours
    # Ours stop where Ray's next argument is one Cairn does not take at all.
    following = ray_names[len(ours):len(ours) + 1]
    assert not set(following) & set(inspect.signature(cls).parameters)


def test_checkpoint_config_takes_ray_s_arguments_by_position() -> None:
    config = CheckpointConfig(2, "loss", "min")
    assert (config.num_to_keep, config.checkpoint_score_attribute,
            config.checkpoint_score_order) == (2, "loss", "min")
    assert config == CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="loss",
                                      checkpoint_score_order="min")


def test_failure_config_takes_max_failures_by_position() -> None:
    assert FailureConfig(3) == FailureConfig(max_failures=3)


def test_scaling_config_takes_ray_s_arguments_by_position() -> None:
    config = ScalingConfig(None, 2, True, {"GPU": 1, "CPU": 2}, "SPREAD", "A100")
    assert config == ScalingConfig(num_workers=2, use_gpu=True,
                                   resources_per_worker={"GPU": 1, "CPU": 2},
                                   placement_strategy="SPREAD", accelerator_type="A100")
    # None is Ray's default of the removed trainer_resources: accepted, as Ray accepts it.
    assert ScalingConfig(trainer_resources=None) == ScalingConfig()


def test_run_config_takes_ray_s_arguments_by_position(tmp_path: Path) -> None:
    recorder = Callback()
    config = RunConfig("nm", str(tmp_path), None, FailureConfig(2), CheckpointConfig(1),
                       [recorder], {"env_vars": {"SEED": "1"}})
    assert (config.name, config.storage_path) == ("nm", str(tmp_path))
    assert config.failure_config.max_failures == 2
    assert config.checkpoint_config.num_to_keep == 1
    assert list(config.callbacks) == [recorder]
    assert config.worker_env == {"SEED": "1"}


def test_validation_configs_take_ray_s_arguments_by_position() -> None:
    task = ValidationTaskConfig({"split": "val"}, 5)
    assert (task.fn_kwargs, task.timeout_s) == ({"split": "val"}, 5)
    assert ValidationConfig(_validate, task, None).task_config is task


@pytest.mark.parametrize("build, match", [
    (lambda: CheckpointConfig(2, "loss", "min", 5), r"`checkpoint_frequency` is deprecated"),
    (lambda: CheckpointConfig(2, "loss", "min", "DEPRECATED", True),
     r"`checkpoint_at_end` is deprecated"),
    (lambda: FailureConfig(3, True), r"`FailureConfig\(fail_fast\)` is deprecated"),
    (lambda: ScalingConfig({"CPU": 1}), r"`ScalingConfig\(trainer_resources\)` is deprecated"),
    # Ray Train 2.60 takes the 2 for trainer_resources too; Cairn says what was meant.
    (lambda: ScalingConfig(2, False), r"ScalingConfig\(trainer_resources=2\) looks like a "
                                      r"number of workers given by position.*"
                                      r"ScalingConfig\(num_workers=2\)"),
], ids=["checkpoint_frequency", "checkpoint_at_end", "fail_fast", "trainer_resources",
        "trainer_resources_int"])
def test_an_argument_ray_removed_is_refused_by_position(build: Any, match: str) -> None:
    with pytest.raises(ConfigDeprecationError, match=match):
        build()


@pytest.mark.parametrize("build", [
    lambda: ScalingConfig(None, 1, False, None, "PACK", None, "local"),
    lambda: CheckpointConfig(None, None, "max", "DEPRECATED", "DEPRECATED", 2),
    lambda: FailureConfig(0, "DEPRECATED", 600.0),
    lambda: RunConfig(None, None, None, None, None, None, None, None),
], ids=["ScalingConfig", "CheckpointConfig", "FailureConfig", "RunConfig"])
def test_cairn_s_own_arguments_are_keyword_only(build: Any) -> None:
    with pytest.raises(TypeError, match=r"positional arguments but \d+ were given"):
        build()


def test_run_config_callbacks_is_a_list_to_append_to_as_in_ray() -> None:
    first, second = RunConfig(), RunConfig(callbacks=None)
    recorder = Callback()
    first.callbacks.append(recorder)  # type: ignore[attr-defined]
    assert first.callbacks == [recorder]
    assert second.callbacks == [] and RunConfig().callbacks == []
    assert RunConfig(callbacks=()).callbacks == []
    # The list takes no part in the hash: a config stays hashable, equal ones hash equal.
    assert hash(RunConfig(name="a")) == hash(RunConfig(name="a", callbacks=[recorder]))
    assert RunConfig(name="a") != RunConfig(name="a", callbacks=[recorder])


def test_configs_built_by_position_pickle_and_replace() -> None:
    configs = [ScalingConfig(None, 2), CheckpointConfig(2, "loss", "min"), FailureConfig(3),
               RunConfig("nm", None, None, FailureConfig(1), CheckpointConfig(1))]
    for config in configs:
        copied = pickle.loads(pickle.dumps(config))
        assert copied == config
        assert dataclasses.replace(copied) == config
