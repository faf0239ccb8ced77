"""Argument checks for ``report()``, raised in the worker where the mistake is made."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from cairn._src.errors import ReportError
from cairn._src.run.layout import RESERVED_NAMES, is_safe_dir_name


def _to_json_value(value: Any) -> Any:
    # numpy and torch scalars (and 0-d arrays/tensors) become plain Python numbers.
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return item()
        except (ValueError, RuntimeError):
            pass
    raise TypeError(type(value).__name__)


def validate_metrics(metrics: object) -> dict[str, Any]:
    """A plain, JSON-serializable copy of ``metrics``, or :class:`ReportError`."""
    if not isinstance(metrics, Mapping):
        raise ReportError(
            f"report(metrics={_short(metrics)}) must be a dict of metric names to values, "
            f"not {type(metrics).__name__}."
        )
    for key in metrics:
        if not isinstance(key, str):
            raise ReportError(
                f"report(metrics=...) has the key {key!r} of type {type(key).__name__}; "
                "metric names must be strings."
            )
    try:
        text = json.dumps(metrics, default=_to_json_value, allow_nan=True)
    except (TypeError, ValueError):
        for key, value in metrics.items():
            try:
                json.dumps(value, default=_to_json_value, allow_nan=True)
            except (TypeError, ValueError) as exc:
                raise ReportError(
                    f"report(metrics=...) has the value {_short(value)} for {key!r} "
                    f"({type(value).__name__}), which cannot be serialized: report numbers, "
                    "strings, booleans, None, or lists and dicts of them."
                ) from exc
        raise
    result: dict[str, Any] = json.loads(text)
    return result


def score_value(metrics: Mapping[str, Any], attribute: str) -> Any:
    if attribute in metrics:
        return metrics[attribute]
    value: Any = metrics
    for part in attribute.split("/"):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def check_score_attribute(metrics: Mapping[str, Any], attribute: str | None) -> None:
    if attribute is None:
        return
    value = score_value(metrics, attribute)
    if value is None:
        raise ReportError(
            f"report(metrics=...) has no {attribute!r}, the checkpoint_score_attribute of "
            f"this run's CheckpointConfig; a checkpoint report must include it. "
            f"Metrics given: {sorted(metrics)}."
        )
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ReportError(
            f"report(metrics=...) has {attribute!r}={value!r}; the "
            "checkpoint_score_attribute must be a number (not NaN)."
        )


def check_dir_name(name: object) -> str:
    if not isinstance(name, str) or not is_safe_dir_name(name):
        reserved = ", ".join(sorted(RESERVED_NAMES))
        raise ReportError(
            f"report(checkpoint_dir_name={name!r}) is not a safe directory name: use one path "
            "component of letters, digits and '_', '-', '.', '=' (not starting with '.' or "
            f"'-', no '..', at most 200 characters, not one of {reserved})."
        )
    return name


def _short(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
