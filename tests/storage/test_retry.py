"""Which errors are retried, and how call_with_retry behaves."""

from __future__ import annotations

import errno

import pytest

from cairn._src.errors import ConfigError, StorageError
from cairn._src.storage.retry import (
    RetryPolicy,
    TransientStorageError,
    call_with_retry,
    is_transient,
)


@pytest.mark.parametrize(
    "exc",
    [
        TransientStorageError("custom store hiccup"),
        TimeoutError("read timed out"),
        ConnectionResetError("reset"),
        OSError(errno.ECONNRESET, "Connection reset by peer"),
        OSError("AWS Error SLOW_DOWN during PutObject operation: Please reduce your rate"),
        OSError("AWS Error NETWORK_CONNECTION during GetObject operation: curlCode: 7"),
        OSError("When uploading part: AWS Error SERVICE_UNAVAILABLE"),
        OSError("HTTP 503 Service Unavailable"),
        OSError("got status 429 from server"),
        OSError(errno.EHOSTUNREACH, "No route to host"),
        OSError("Timeout was reached reading 's3://bucket/runs/x/model.pt'"),
    ],
)
def test_transient_errors(exc: BaseException) -> None:
    assert is_transient(exc)


@pytest.mark.parametrize(
    "exc",
    [
        FileNotFoundError("gone"),
        PermissionError("denied"),
        OSError("Path does not exist 'bucket/run/checkpoint_000500/model.pt'"),
        OSError("AWS Error ACCESS_DENIED during HeadObject operation"),
        # The words of a path are the user's: a permanent error on them is not transient.
        OSError("AWS Error ACCESS_DENIED for key 'runs/timeout_ablation/model.pt'"),
        OSError("Path does not exist: gs://bucket/throttling-study/lr-500/ckpt"),
        StorageError("already converted, never retried again"),
        ValueError("bad input"),
    ],
)
def test_permanent_errors(exc: BaseException) -> None:
    assert not is_transient(exc)


def test_call_with_retry_retries_then_succeeds() -> None:
    calls: list[int] = []
    sleeps: list[float] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise TransientStorageError("try again")
        return "ok"

    policy = RetryPolicy(max_attempts=5, initial_backoff_s=0.01, jitter=False)
    assert call_with_retry(flaky, policy, what="test", sleep=sleeps.append) == "ok"
    assert len(calls) == 3 and sleeps == [0.01, 0.02]


def test_call_with_retry_raises_permanent_errors_at_once() -> None:
    calls: list[int] = []

    def denied() -> None:
        calls.append(1)
        raise PermissionError("denied")

    with pytest.raises(PermissionError):
        call_with_retry(denied, RetryPolicy(), what="test", sleep=lambda s: None)
    assert calls == [1]


def test_bad_policy_values() -> None:
    with pytest.raises(ConfigError, match=r"max_attempts=0 must be an integer >= 1"):
        RetryPolicy(max_attempts=0)
