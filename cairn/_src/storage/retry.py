"""Retries with exponential backoff and jitter for storage operations.

Every storage call Cairn makes goes through :func:`call_with_retry`, whatever the backend:
a transient error (a dropped connection, a throttled request, a timeout) is retried with
backoff; a permanent one (a missing file, a permission error, bad input) is raised at once.
"""

from __future__ import annotations

import errno
import logging
import math
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from cairn._src.errors import CairnError, ConfigError
from cairn._src.field_types import check_field_types

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Errno values that a retry can fix: the store was busy, the connection dropped.
_TRANSIENT_ERRNOS = frozenset(
    {
        errno.EAGAIN,
        errno.EBUSY,
        errno.ECONNABORTED,
        errno.ECONNREFUSED,
        errno.ECONNRESET,
        errno.EINTR,
        errno.EIO,
        errno.ENETDOWN,
        errno.ENETRESET,
        errno.ENETUNREACH,
        errno.EHOSTUNREACH,
        errno.EPIPE,
        errno.ETIMEDOUT,
    }
)

# Words in the message of errors raised by pyarrow's S3/GCS clients and fsspec backends
# for conditions that pass: they come as plain OSError without an errno.
_TRANSIENT_WORDS = (
    "timed out",
    "timeout",
    "connection reset",
    "connection refused",
    "connection aborted",
    "broken pipe",
    "temporarily unavailable",
    "slow down",
    "slowdown",
    "throttl",
    "too many requests",
    "service unavailable",
    "internal error",
    "internalerror",
    "request limit",
    "curl error",
    "couldn't connect",
    # pyarrow's S3 client names AWS error codes in upper snake case.
    "slow_down",
    "throttling",
    "network_connection",
    "service_unavailable",
    "internal_failure",
    "request_timeout",
)
# HTTP statuses that pass, as whole numbers: a path such as 'checkpoint_000500' must not
# make a permanent error look transient.
_TRANSIENT_STATUS_RE = re.compile(r"(?<![\w.])(500|502|503|504|429)(?![\w.])")
# Paths and URIs in a message (any word holding a "/"): their names are the user's
# ('runs/timeout_ablation/...'), never a word about the error.
_PATH_RE = re.compile(r"\S*/\S*")


class TransientStorageError(OSError):
    """Raise this from a custom store for an error that a retry may fix."""


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is worth retrying."""
    if isinstance(exc, CairnError):
        return False
    if isinstance(exc, TransientStorageError):
        return True
    if isinstance(exc, (TimeoutError, ConnectionError)):
        return True
    if isinstance(exc, (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError,
                        NotADirectoryError)):
        return False
    if isinstance(exc, OSError):
        if exc.errno is not None:
            return exc.errno in _TRANSIENT_ERRNOS
        text = _PATH_RE.sub(" ", str(exc).lower())
        return any(word in text for word in _TRANSIENT_WORDS) or bool(
            _TRANSIENT_STATUS_RE.search(text)
        )
    return False


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """Exponential backoff with full jitter.

    The n-th retry sleeps a random time in ``[0, min(max_backoff_s, initial_backoff_s *
    multiplier**n)]``. ``max_attempts`` counts the first try: ``1`` disables retries.
    """

    max_attempts: int = 5
    initial_backoff_s: float = 0.05
    max_backoff_s: float = 5.0
    multiplier: float = 2.0
    jitter: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) or (
            self.max_attempts < 1
        ):
            raise ConfigError(
                f"RetryPolicy.max_attempts={self.max_attempts!r} must be an integer >= 1."
            )
        for name in ("initial_backoff_s", "max_backoff_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    math.isfinite(value) and value >= 0):
                raise ConfigError(f"RetryPolicy.{name}={value!r} must be a finite number "
                                  ">= 0 (seconds), such as 0.05.")
        if (
            isinstance(self.multiplier, bool)
            or not isinstance(self.multiplier, (int, float))
            or not (math.isfinite(self.multiplier) and self.multiplier >= 1)
        ):
            raise ConfigError(f"RetryPolicy.multiplier={self.multiplier!r} must be a finite "
                              "number >= 1, such as 2.0.")
        check_field_types(self)

    def backoff(self, retry_number: int) -> float:
        """Seconds to sleep before retry number ``retry_number`` (0-based)."""
        try:
            growth = self.initial_backoff_s * self.multiplier**retry_number
        except OverflowError:  # a float power past 1e308: far above any max_backoff_s
            growth = math.inf
        ceiling = min(self.max_backoff_s, growth)
        return random.uniform(0, ceiling) if self.jitter else ceiling


NO_RETRY = RetryPolicy(max_attempts=1)
# The default for functions taking a policy (frozen, so one shared instance is safe).
DEFAULT_RETRY = RetryPolicy()


def call_with_retry(
    fn: Callable[[], T],
    policy: RetryPolicy,
    *,
    what: str,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call ``fn`` until it succeeds, retrying transient errors per ``policy``.

    ``what`` describes the operation for logs (never include credentials in it). The last
    error is raised unchanged once the attempts are spent or the error is permanent.
    """
    attempt = 0
    while True:
        try:
            return fn()
        except Exception as exc:
            attempt += 1
            if attempt >= policy.max_attempts or not is_transient(exc):
                raise
            delay = policy.backoff(attempt - 1)
            logger.warning(
                "Transient error in %s (attempt %d of %d), retrying in %.2fs: %s",
                what, attempt, policy.max_attempts, delay, exc,
            )
            sleep(delay)
