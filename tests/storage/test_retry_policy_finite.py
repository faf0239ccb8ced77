"""RetryPolicy takes finite backoffs only: NaN or infinity would pass a ``< 0`` check and
crash the first retry with an unrelated ValueError or OverflowError."""

from __future__ import annotations

import math

import pytest

from cairn import RetryPolicy
from cairn._src.errors import ConfigError


@pytest.mark.parametrize("field", ["initial_backoff_s", "max_backoff_s"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_backoff_must_be_finite(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=(
            rf"^RetryPolicy\.{field}={value!r} must be a finite number >= 0 \(seconds\), "
            r"such as 0\.05\.$")):
        RetryPolicy(**{field: value})


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_the_multiplier_must_be_finite(value: float) -> None:
    with pytest.raises(ConfigError, match=(
            rf"^RetryPolicy\.multiplier={value!r} must be a finite number >= 1, such as "
            r"2\.0\.$")):
        RetryPolicy(multiplier=value)


def test_a_negative_backoff_is_still_refused() -> None:
    with pytest.raises(ConfigError, match=r"^RetryPolicy\.max_backoff_s=-1 must be a finite"):
        RetryPolicy(max_backoff_s=-1)


def test_a_backoff_after_very_many_retries_stays_at_its_ceiling() -> None:
    policy = RetryPolicy(max_attempts=10_000, max_backoff_s=3.0, jitter=False)
    assert policy.backoff(5_000) == 3.0
