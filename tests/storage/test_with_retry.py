"""The one retry wrapper of the per-file transfer tasks (``parallel.with_retry``)."""

from __future__ import annotations

import errno

import pytest

from cairn import CheckpointNotFoundError, StorageError
from cairn._src.storage.checksum import TransferCancelled
from cairn._src.storage.parallel import with_retry
from cairn._src.storage.retry import RetryPolicy

FAST = RetryPolicy(max_attempts=3, initial_backoff_s=0.0, max_backoff_s=0.0)


def test_a_transient_error_is_retried_and_then_succeeds() -> None:
    tries: list[int] = []

    def flaky() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise OSError(errno.EAGAIN, "try again")
        return "done"

    assert with_retry(flaky, FAST, "read a/b") == "done"
    assert len(tries) == 3


def test_what_still_fails_is_cairn_s_error_naming_the_operation() -> None:
    def missing() -> None:
        raise FileNotFoundError(errno.ENOENT, "gone")

    with pytest.raises(CheckpointNotFoundError, match=r"Could not read a/b: it does not "
                       r"exist") as caught:
        with_retry(missing, FAST, "read a/b")
    assert isinstance(caught.value.__cause__, FileNotFoundError)

    def refused() -> None:
        raise PermissionError(errno.EACCES, "no")

    with pytest.raises(StorageError, match=r"Could not write x: permission denied .*"
                       r"Check access rights and credentials"):
        with_retry(refused, FAST, "write x")


def test_a_cancelled_transfer_and_cairn_s_errors_pass_through_unchanged() -> None:
    cancelled = TransferCancelled()
    own = StorageError("already Cairn's")
    for error in (cancelled, own):
        def fail(error: Exception = error) -> None:
            raise error

        with pytest.raises(type(error)) as caught:
            with_retry(fail, FAST, "read a")
        assert caught.value is error
