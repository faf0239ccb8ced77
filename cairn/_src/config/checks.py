"""Checks the configs share: a bad value raises :class:`ConfigError` naming the field, the
value received and what is accepted."""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence

from cairn._src import migration
from cairn._src.errors import ConfigError


def left_out(value: object) -> bool:
    """Whether an argument Ray Train v2 removed holds its default, compared by value as
    Ray compares it: a config that was pickled (sent to a subprocess or a Ray task) holds
    an equal string, not the same object, and must not read as that argument given."""
    return value is migration.DEPRECATED or (
        type(value) is str and value == migration.DEPRECATED)


def check_int(name: str, value: object, *, minimum: int, allow: Sequence[int] = ()) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name}={value!r} must be an integer >= {minimum}.")
    if value < minimum and value not in allow:
        extra = "".join(f" or {a}" for a in allow)
        raise ConfigError(f"{name}={value!r} must be an integer >= {minimum}{extra}.")


def check_positive_float(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"{name}={value!r} must be a number > 0 (seconds).")
    check_finite_seconds(name, value)


def check_finite_seconds(name: str, value: int | float) -> None:
    """A number of seconds a wait can be given: finite, and within what a thread's wait
    accepts (``threading.TIMEOUT_MAX``); an int too large for a float is not."""
    try:
        seconds = float(value)
    except OverflowError:
        seconds = math.inf
    if not seconds <= threading.TIMEOUT_MAX:
        raise ConfigError(f"{name}={value!r} must be a finite number of seconds, at most "
                          f"{threading.TIMEOUT_MAX:.0f}.")

