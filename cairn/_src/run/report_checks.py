"""Argument checks for ``report()``, raised in the worker where the mistake is made."""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Mapping
from typing import Any

from cairn._src.errors import ReportError
from cairn._src.run.layout import (
    RESERVED_NAMES,
    RESERVED_PREFIX,
    has_safe_characters,
    is_reserved_name,
    looks_like_default_dir_name,
)
from cairn._src.run.schema import MAX_USER_DEPTH, decimal_digits, nesting_depth, short_repr
from cairn._src.storage.fileio import TEMPORARY_MARK


def _to_json_value(value: Any) -> Any:
    # Any mapping (a MappingProxyType, a ChainMap) becomes a plain dict, as json.dumps
    # writes a dict; numpy and torch scalars (and 0-d arrays/tensors) plain Python numbers.
    if isinstance(value, Mapping):
        return dict(value)
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return item()
        except (ValueError, RuntimeError):
            pass
    raise TypeError(type(value).__name__)


# Values whose JSON round trip gives back an equal value of the same type (NaN and the
# infinities too, with allow_nan), so that a flat dict of them is its own plain copy.
_PLAIN_TYPES = frozenset({int, float, str, bool, type(None)})

# The most decimal digits of an int in metrics: Python's default limit for turning an int
# into text and back (sys.int_info.default_max_str_digits), so that the driver can write it
# and every later process (`cairn show`, Result.from_path) can read it, whatever limit the
# worker runs with.
_MAX_INT_DIGITS = 4300
_INT_BOUND = 10**_MAX_INT_DIGITS


# C0 controls, DEL and C1 controls: never in a name Cairn writes (a terminal would obey them
# when `cairn show` prints the name, and a log line could be forged with a newline).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def _check_keys(value: Any, what: str) -> None:
    """Raise :class:`ReportError` for a dict key, at any depth, holding a control
    character. ``value`` is plain JSON data (dicts, lists, scalars)."""
    if isinstance(value, dict):
        for key, item in value.items():
            found = _CONTROL.search(key)
            if found is not None:
                raise ReportError(
                    f"{what} has the metric name {key!a}, which holds the control "
                    f"character {found.group()!a}; metric names may not hold control "
                    "characters (U+0000-U+001F, U+007F-U+009F): rename the metric."
                )
            _check_keys(item, what)
    elif isinstance(value, list):
        for item in value:
            _check_keys(item, what)


def validate_metrics(metrics: object, *, what: str = "report(metrics=...)") -> dict[str, Any]:
    """A plain, JSON-serializable copy of ``metrics``, or :class:`ReportError` (``what``
    names where the metrics come from in its message).

    Accepted: any mapping with str keys (a ``MappingProxyType``, a ``ChainMap``), copied
    as a plain dict, nested mappings included. Refused: anything else, nesting deeper than
    the run's schema keeps, values JSON cannot hold, ints of more than 4300 digits, and
    metric names (dict keys at any depth) that hold a control character. NaN and the
    infinities are accepted (a loss may be NaN).
    """
    if type(metrics) is dict and _flat_and_plain(metrics):
        # The usual report (a flat dict of numbers and strings): the same copy as the JSON
        # round trip below, in under a tenth of its time.
        if _CONTROL.search("".join(metrics)):
            _check_keys(metrics, what)
        return dict(metrics)
    if not isinstance(metrics, Mapping):
        raise ReportError(
            f"report(metrics={_short(metrics)}) must be a dict of metric names to values, "
            f"not {type(metrics).__name__}."
        )
    for key in metrics:
        if not isinstance(key, str):
            raise ReportError(
                f"{what} has the key {_short(key)} of type {type(key).__name__}; "
                "metric names must be strings."
            )
    if nesting_depth(metrics, MAX_USER_DEPTH) > MAX_USER_DEPTH:
        # Measured without recursion: json.dumps would raise RecursionError, which is
        # not a bad-input error and would be retried as a worker failure.
        raise _too_deep(what)
    converted: list[object] = []

    def to_json_value(value: Any) -> Any:
        converted.append(value)
        return _to_json_value(value)

    try:
        text = json.dumps(metrics, default=to_json_value, allow_nan=True)
        # A worker that raised Python's digit limit (or runs without one) writes longer
        # ints than the driver reads: parse_int refuses them here, where _unstorable names
        # the metric.
        result: dict[str, Any] = (json.loads(text) if _int_text_bounded()
                                  else json.loads(text, parse_int=_bounded_int))
    except (TypeError, ValueError, RecursionError) as exc:
        found = _unstorable(metrics, what)
        if found is None:  # this worker's own digit limit is below _MAX_INT_DIGITS, for one
            raise ReportError(
                f"{what} cannot be serialized ({type(exc).__name__}: {_short(str(exc))}): "
                "report numbers, strings, booleans, None, or lists and dicts of them."
            ) from exc
        # Without json's error, whose advice (raise Python's digit limit) would not help.
        raise found from None
    if converted and nesting_depth(result, MAX_USER_DEPTH) > MAX_USER_DEPTH:
        # What nesting_depth did not count above: a mapping other than a dict.
        raise _too_deep(what)
    _check_keys(result, what)
    return result


def _flat_and_plain(metrics: dict[Any, Any]) -> bool:
    """Whether ``metrics`` has str keys and values of _PLAIN_TYPES only, its ints within
    _MAX_INT_DIGITS digits (one loop: the check of every report)."""
    for key, value in metrics.items():
        kind = type(value)
        if type(key) is not str or kind not in _PLAIN_TYPES or (
                kind is int and not -_INT_BOUND < value < _INT_BOUND):
            return False
    return True


def _too_deep(what: str) -> ReportError:
    return ReportError(
        f"{what} is nested more than {MAX_USER_DEPTH} levels deep; "
        "report flat metrics (for example 'a/b/c' keys instead of nested dicts)."
    )


def _int_text_bounded() -> bool:
    """Whether this process refuses ints of more than _MAX_INT_DIGITS digits as text."""
    # sys.get_int_max_str_digits is new in Python 3.11 (and 3.10.7); before it, no limit.
    limit: int = getattr(sys, "get_int_max_str_digits", lambda: 0)()
    return 0 < limit <= _MAX_INT_DIGITS


def _bounded_int(text: str) -> int:
    if len(text) - text.startswith("-") > _MAX_INT_DIGITS:
        raise ValueError(f"an int of {len(text)} characters")
    return int(text)


def _unstorable(metrics: Mapping[str, Any], what: str) -> ReportError | None:
    """The error for the first value of ``metrics`` that JSON cannot hold, named by its
    key path (``'x'[0]['y']``); None if there is none. Walked without recursion, and
    without the repr() of a value that repr() cannot show."""
    stack: list[tuple[tuple[object, ...], Any, int]] = [
        ((key,), value, 1) for key, value in reversed(list(metrics.items()))]
    while stack:
        path, value, depth = stack.pop()
        if depth > MAX_USER_DEPTH:
            return _too_deep(what)
        if isinstance(value, Mapping):
            for key, item in reversed(list(value.items())):
                # The keys json.dumps writes (as strings), as a dict's at the top.
                if not (key is None or isinstance(key, (str, float))
                        or (isinstance(key, int) and -_INT_BOUND < key < _INT_BOUND)):
                    return ReportError(
                        f"{what} has the key {_short(key)} of type {type(key).__name__} "
                        f"in {_key_path(path)}; metric names must be strings."
                    )
                stack.append(((*path, key), item, depth + 1))
            continue
        if isinstance(value, (list, tuple)):
            stack.extend(((*path, number), item, depth + 1)
                         for number, item in reversed(list(enumerate(value))))
            continue
        if not (value is None or isinstance(value, (str, int, float))):
            try:
                plain = _to_json_value(value)
            except TypeError:
                plain = _UNSERIALIZABLE
            if isinstance(plain, (Mapping, list, tuple)):
                stack.append((path, plain, depth))
                continue
            if not (plain is None or isinstance(plain, (str, int, float))):
                return ReportError(
                    f"{what} has the value {_short(value)} for {_key_path(path)} "
                    f"({type(value).__name__}), which cannot be serialized: report numbers, "
                    "strings, booleans, None, or lists and dicts of them."
                )
            value = plain
        if isinstance(value, int) and not -_INT_BOUND < value < _INT_BOUND:
            return ReportError(
                f"{what} has an int of {decimal_digits(value)} digits for {_key_path(path)}, "
                f"too large to store: an int in metrics may have at most {_MAX_INT_DIGITS} "
                "digits. Report a smaller number instead (its logarithm, for example)."
            )
    return None


_UNSERIALIZABLE = object()


def _key_path(path: tuple[object, ...]) -> str:
    return _short(path[0]) + "".join(f"[{_short(part)}]" for part in path[1:])


def score_value(metrics: Mapping[str, Any], attribute: str) -> Any:
    """``metrics``' value of ``attribute``: the flat key first, then ``/`` reaching into
    nested metrics; None when it has none (or it is None)."""
    found = _lookup(metrics, attribute)
    return None if found is _MISSING else found


def score_present(metrics: Mapping[str, Any], attribute: str) -> bool:
    """Whether ``metrics`` name ``attribute`` at all (its value may be None)."""
    return _lookup(metrics, attribute) is not _MISSING


_MISSING = object()


def _lookup(metrics: Mapping[str, Any], attribute: str) -> Any:
    if attribute in metrics:
        return metrics[attribute]
    value: Any = metrics
    for part in attribute.split("/"):
        if not isinstance(value, Mapping) or part not in value:
            return _MISSING
        value = value[part]
    return value


def check_score_attribute(metrics: Mapping[str, Any], attribute: str | None, *,
                          what: str = "report(metrics=...)") -> None:
    """:class:`ReportError` unless ``metrics`` hold ``attribute`` as a number (not a bool)
    within a double's range. NaN is accepted, as Ray Train accepts it (a diverged step's
    loss): retention ranks it as the worst score whatever the order (:func:`is_nan_score`)."""
    if attribute is None:
        return
    value = score_value(metrics, attribute)
    if value is None:
        raise ReportError(
            f"{what} has no {attribute!r}, the checkpoint_score_attribute of "
            f"this run's CheckpointConfig; a checkpoint report must include it. "
            f"Metrics given: {sorted(metrics)}."
        )
    if rankable(value) is None and not _is_nan(value):
        beyond = isinstance(value, int) and not isinstance(value, bool)
        raise ReportError(
            f"{what} has {attribute!r}={short_repr(value)}; the checkpoint_score_attribute "
            "must be a number (" + ("within a double's range, below 1.8e+308 in magnitude)"
                                    if beyond else "an int or a float, NaN included), not "
                                    f"{type(value).__name__}") + "."
        )


def is_nan_score(metrics: Mapping[str, Any], attribute: str | None) -> bool:
    """Whether ``metrics``' value of ``attribute`` is NaN: a score report() accepts and
    retention ranks as the worst, below every number (-inf included) in both orders, as
    Ray Train's checkpoint manager ranks it."""
    return attribute is not None and _is_nan(score_value(metrics, attribute))


def _is_nan(value: object) -> bool:
    return isinstance(value, float) and math.isnan(value)


def rankable(value: object) -> float | None:
    """``value`` as a score retention can rank by: a number (not a bool), not NaN, that a
    float holds (an int of 400 digits does not); None otherwise (retention ranks those,
    NaN included, below every number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return None if math.isnan(number) else number


def check_merged_score(reported: Mapping[str, Any], validated: Mapping[str, Any],
                       attribute: str | None, *, what: str) -> None:
    """:class:`ReportError` when merging a validation's ``validated`` metrics into a
    checkpoint's ``reported`` ones (``{**reported, **validated}``, as Ray Train does) would
    leave retention a score the validation did not give: the reported score erased (a
    nested dict replaced by one without it), or the validation's own score shadowed (the
    report named it as the flat key ``"val/loss"``, the validation nested)."""
    if attribute is None:
        return
    merged = {**reported, **validated}
    if score_present(validated, attribute):
        found, given = _lookup(merged, attribute), _lookup(validated, attribute)
        # By identity first: a NaN the validation gave is not equal to itself.
        if found is not given and found != given:
            raise ReportError(
                f"{what} give {attribute!r} nested, while the checkpoint's reported metrics "
                f"have the flat key {attribute!r}, which retention reads first: return it "
                f"as the flat key {attribute!r} too."
            )
    elif score_present(reported, attribute) and not score_present(merged, attribute):
        top = attribute.split("/", 1)[0]
        raise ReportError(
            f"{what} replace {top!r} of the checkpoint's reported metrics with "
            f"{_short(validated.get(top))}, which has no {attribute!r}, the "
            "checkpoint_score_attribute: retention would rank the checkpoint last. Return "
            f"{attribute!r} in it too, or use another key."
        )


def check_dir_name(name: object) -> str:
    """``name`` if a report may use it as ``checkpoint_dir_name``, else :class:`ReportError`.

    Accepted: one path component of letters, digits and ``_.-=`` (the whole string; a
    trailing newline is refused), that is none of the run's own entries (any letter
    case) and not a default name (``checkpoint_000003``), which a later report without
    ``checkpoint_dir_name`` may need.
    """
    if not isinstance(name, str) or not has_safe_characters(name):
        control = _CONTROL.search(name) if isinstance(name, str) else None
        held = ("" if control is None else
                f" (it holds the control character {control.group()!a})")
        raise ReportError(
            f"report(checkpoint_dir_name={_short(name)}) is not a safe directory name{held}: use "
            "one path component of letters, digits and '_', '-', '.', '=' (not starting "
            "with '.' or '-', no '..', no whitespace, at most 200 characters)."
        )
    if is_reserved_name(name):
        reserved = ", ".join(repr(n) for n in sorted(RESERVED_NAMES))
        raise ReportError(
            f"report(checkpoint_dir_name={name!r}) names one of Cairn's own entries in the "
            f"run directory; choose another name (reserved: {reserved}, any name starting "
            f"with {RESERVED_PREFIX!r} or containing {TEMPORARY_MARK!r}, in any letter case)."
        )
    if looks_like_default_dir_name(name):
        raise ReportError(
            f"report(checkpoint_dir_name={name!r}) has the form of the names Cairn gives "
            "checkpoints itself ('checkpoint_' and 6 or more digits), which a later report "
            "may need; choose another name, or leave checkpoint_dir_name out to get the "
            "default one."
        )
    return name


def _short(value: object) -> str:
    return short_repr(value, 80)
