"""Configs as they travel: pickled to another process and rebuilt there, and shown by
repr() without the credentials of a storage URI."""

from __future__ import annotations

import dataclasses
import pickle

import cloudpickle
import pytest

from cairn import (
    CheckpointConfig,
    ConfigDeprecationError,
    ConfigError,
    FailureConfig,
    RunConfig,
    ScalingConfig,
)

CONFIGS = [RunConfig(name="run"), ScalingConfig(num_workers=2), CheckpointConfig(num_to_keep=2),
           FailureConfig(max_failures=1)]


@pytest.mark.parametrize("dumps", [pickle.dumps, cloudpickle.dumps])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: type(c).__name__)
def test_a_pickled_config_can_be_rebuilt_with_replace(config: object, dumps: object) -> None:
    # Ray Train compares its removed arguments with their default by value; a config sent
    # to a subprocess or a Ray task holds an equal string, not the same object.
    copied = pickle.loads(dumps(config))  # type: ignore[operator]
    assert dataclasses.replace(copied) == config


def test_a_removed_argument_given_is_still_refused() -> None:
    with pytest.raises(ConfigDeprecationError, match=r"`RunConfig\(verbose\)` is deprecated"):
        RunConfig(verbose=1)
    with pytest.raises(ConfigDeprecationError, match=r"`FailureConfig\(fail_fast\)`"):
        FailureConfig(fail_fast=False)
    with pytest.raises(ConfigDeprecationError, match=r"`checkpoint_at_end` is deprecated"):
        CheckpointConfig(checkpoint_at_end=None)
    with pytest.raises(ConfigDeprecationError, match=r"ScalingConfig\(trainer_resources\)"):
        ScalingConfig(trainer_resources={"CPU": 1})


@pytest.mark.parametrize("uri", ["s3://AKIAEXAMPLE:s3cr3t-key@bucket/runs",
                                 "s3://bucket/runs?access_key=AKIAEXAMPLE&secret_key=s3cr3t-key"])
def test_the_repr_of_a_run_config_hides_the_credentials_of_its_uri(uri: str) -> None:
    shown = repr(RunConfig(name="run", storage_path=uri))
    assert "s3cr3t-key" not in shown
    assert "storage_path='s3://bucket/runs" in shown and "name='run'" in shown


def test_the_error_for_a_nul_in_a_storage_uri_hides_its_credentials() -> None:
    with pytest.raises(ConfigError, match=r"RunConfig\.storage_path='s3://bucket/r\\x00' must "
                                          r"be a path or URI without NUL") as caught:
        RunConfig(storage_path="s3://AKIAEXAMPLE:s3cr3t-key@bucket/r\0")
    assert "s3cr3t-key" not in str(caught.value)
