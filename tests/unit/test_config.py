from __future__ import annotations

import pytest

from cairn import (
    CheckpointConfig,
    CheckpointUploadMode,
    ConfigError,
    FailureConfig,
    RetryPolicy,
    RunConfig,
    ScalingConfig,
)


def test_num_workers_zero() -> None:
    with pytest.raises(ConfigError, match=r"ScalingConfig.num_workers=0 must be an integer >= 1"):
        ScalingConfig(num_workers=0)


def test_num_to_keep_zero() -> None:
    with pytest.raises(ConfigError, match=r"CheckpointConfig.num_to_keep=0 must be an integer"):
        CheckpointConfig(num_to_keep=0)


def test_score_order() -> None:
    with pytest.raises(ConfigError,
                       match=r"checkpoint_score_order='up' is not one of 'max', 'min'"):
        CheckpointConfig(checkpoint_score_order="up")  # type: ignore[arg-type]


def test_upload_mode_unknown() -> None:
    with pytest.raises(ConfigError, match=r"'fast' is not one of 'SYNC', 'ASYNC', 'NO_UPLOAD'"):
        CheckpointUploadMode.parse("fast")
    assert CheckpointUploadMode.parse("async") is CheckpointUploadMode.ASYNC


def test_max_failures() -> None:
    with pytest.raises(ConfigError,
                       match=r"FailureConfig.max_failures=-2 must be an integer >= 0 or -1"):
        FailureConfig(max_failures=-2)
    FailureConfig(max_failures=-1)


def test_run_name_must_be_one_component() -> None:
    with pytest.raises(ConfigError, match=r"RunConfig.name='a/b' must be a single path component"):
        RunConfig(name="a/b")


def test_backend_unknown() -> None:
    with pytest.raises(ConfigError,
                       match=r"ScalingConfig.backend='k8s' is not one of 'local', 'ray'"):
        ScalingConfig(backend="k8s")


def test_retry_policy() -> None:
    with pytest.raises(ConfigError, match=r"RetryPolicy.max_attempts=0 must be an integer >= 1"):
        RetryPolicy(max_attempts=0)
    policy = RetryPolicy(initial_backoff_s=1.0, max_backoff_s=3.0, jitter=False)
    assert [policy.backoff(n) for n in range(3)] == [1.0, 2.0, 3.0]
