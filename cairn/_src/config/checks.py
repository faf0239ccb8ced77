"""Checks the configs share: a bad value raises :class:`ConfigError` naming the field, the
value received and what is accepted."""

from __future__ import annotations

import math
import os
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


def directory_text(value: object, *, shown: str) -> str:
    """``value``, the path of a local directory, as a ``str``; or :class:`ConfigError`
    starting with ``shown`` (the call and its argument: ``"f(path=None)"``) when it is not
    a non-empty ``str`` or ``os.PathLike`` of one."""
    text = os.fspath(value) if isinstance(value, (str, os.PathLike)) else None
    if not isinstance(text, str):
        raise ConfigError(
            f"{shown} must be the path of a local directory, as a str or os.PathLike (for "
            f"example pathlib.Path), not {type(value).__name__}.")
    if not text.strip():
        raise ConfigError(
            f"{shown} names no directory; pass one (for the current directory, '.').")
    return text
