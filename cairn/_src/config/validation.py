"""``ValidationConfig`` and ``ValidationTaskConfig``: validate checkpoints off the train loop.

The names and arguments are Ray Train v2's: ``Trainer(..., validation_config=
ValidationConfig(fn, task_config))`` sets the function, and ``report(..., validation=True)``
or ``validation=ValidationTaskConfig(fn_kwargs=..., timeout_s=...)`` asks for the
checkpoint of that report to be validated. ``fn(checkpoint, **fn_kwargs)`` returns a dict
of metrics, merged into the checkpoint's metrics (the run index and its manifest), which
re-ranks retention. Cairn runs it in the driver, on a thread of its own, one validation
at a time in report order (Ray runs it as a Ray task).
"""

from __future__ import annotations

import json
import logging
import math
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from cairn._src.errors import ConfigError
from cairn._src.field_types import check_field_types

if TYPE_CHECKING:
    from cairn._src.checkpoint.checkpoint import Checkpoint

logger = logging.getLogger(__name__)


class ValidationFn(Protocol):
    """A function that validates a checkpoint and returns a dict of metrics."""

    def __call__(self, checkpoint: Checkpoint, **kwargs: Any) -> dict[str, Any]: ...


@dataclass
class ValidationTaskConfig:
    """One validation task: keyword arguments for the function, and a timeout.

    ``fn_kwargs`` must be JSON-serializable (they are persisted, so that a validation
    still pending when the driver dies runs again on the next ``fit()``); those given to
    ``report()`` override the trainer's defaults. ``timeout_s``: None (no timeout) or
    seconds > 0; a validation that passes it gets the status ``VALIDATION_TIMEOUT`` and
    its result, if it comes later, is ignored. ``float("inf")`` means no timeout and is
    stored as None; a finite value above ``threading.TIMEOUT_MAX`` (what a thread can wait
    for) raises :class:`ConfigError`.
    """

    fn_kwargs: dict[str, Any] | None = None
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        if self.fn_kwargs is None:
            self.fn_kwargs = {}
        if not isinstance(self.fn_kwargs, dict) or not all(
            isinstance(k, str) for k in self.fn_kwargs
        ):
            raise ConfigError(
                f"ValidationTaskConfig.fn_kwargs={self.fn_kwargs!r} must be a dict of "
                "argument names to JSON-serializable values, or None."
            )
        try:
            json.dumps(self.fn_kwargs, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"ValidationTaskConfig.fn_kwargs={self.fn_kwargs!r} is not JSON-serializable "
                f"({exc}); pass numbers, strings, booleans, None, or lists and dicts of them "
                "(load anything larger inside the validation function)."
            ) from exc
        if self.timeout_s is not None and (
            isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (int, float))
            or math.isnan(self.timeout_s) or self.timeout_s <= 0
        ):
            raise ConfigError(
                f"ValidationTaskConfig.timeout_s={self.timeout_s!r} must be None (no timeout) "
                "or a number of seconds > 0."
            )
        if self.timeout_s is not None and math.isinf(self.timeout_s):
            self.timeout_s = None  # no timeout, and JSON has no infinity
        if self.timeout_s is not None and self.timeout_s > threading.TIMEOUT_MAX:
            raise ConfigError(
                f"ValidationTaskConfig.timeout_s={self.timeout_s!r} is longer than a thread "
                f"can wait (threading.TIMEOUT_MAX={threading.TIMEOUT_MAX:g} seconds); pass a "
                "number of seconds up to that, or None (or float('inf')) for no timeout."
            )
        check_field_types(self)

    def to_json(self) -> dict[str, Any]:
        return {"fn_kwargs": dict(self.fn_kwargs or {}), "timeout_s": self.timeout_s}


class ValidationConfig:
    """The validation function of a run, passed as ``Trainer(validation_config=...)``.

    ``fn(checkpoint, **kwargs) -> dict``; ``task_config`` gives the default
    :class:`ValidationTaskConfig`. ``ray_remote_kwargs`` is accepted for Ray Train scripts
    and has no effect: Cairn runs validations on a driver thread, not as Ray tasks.
    """

    def __init__(
        self,
        fn: ValidationFn,
        task_config: ValidationTaskConfig | None = None,
        ray_remote_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if not callable(fn):
            raise ConfigError(
                f"ValidationConfig(fn={fn!r}) must be a function (checkpoint, **kwargs) -> "
                "dict of metrics."
            )
        if task_config is not None and not isinstance(task_config, ValidationTaskConfig):
            raise ConfigError(
                f"ValidationConfig(task_config={task_config!r}) must be a "
                "ValidationTaskConfig or None."
            )
        if ray_remote_kwargs is not None and not isinstance(ray_remote_kwargs, dict):
            raise ConfigError(
                f"ValidationConfig(ray_remote_kwargs={ray_remote_kwargs!r}) must be a dict or "
                "None."
            )
        if ray_remote_kwargs:
            logger.warning("ValidationConfig(ray_remote_kwargs=%s) has no effect: Cairn runs "
                           "validations on a thread of the driver", sorted(ray_remote_kwargs))
        self.fn = fn
        self.task_config = task_config if task_config is not None else ValidationTaskConfig()
        self.ray_remote_kwargs = dict(ray_remote_kwargs or {})

    def __repr__(self) -> str:
        name = getattr(self.fn, "__qualname__", repr(self.fn))
        return f"ValidationConfig(fn={name}, task_config={self.task_config!r})"


def task_for_report(validation: object) -> dict[str, Any] | None:
    """``report(validation=...)`` as the JSON task it sends (None: no validation).

    True asks for the trainer's defaults; a :class:`ValidationTaskConfig` overrides them.
    """
    from cairn._src.errors import ReportError

    if validation is False or validation is None:
        return None
    if validation is True:
        return {}
    if isinstance(validation, ValidationTaskConfig):
        return validation.to_json()
    raise ReportError(
        f"report(validation={validation!r}) must be True, False or a "
        "cairn.ValidationTaskConfig."
    )


def merged_task(config: ValidationConfig, task: dict[str, Any]) -> tuple[dict[str, Any],
                                                                        float | None]:
    """The keyword arguments and timeout of one validation: the report's over the
    trainer's defaults."""
    defaults = config.task_config
    kwargs = {**(defaults.fn_kwargs or {}), **dict(task.get("fn_kwargs") or {})}
    # As in Ray: a ValidationTaskConfig's timeout applies (None too); True takes the default.
    timeout = task["timeout_s"] if "timeout_s" in task else defaults.timeout_s
    if isinstance(timeout, (int, float)) and not timeout < threading.TIMEOUT_MAX:
        timeout = None  # a task persisted before such timeouts were refused: no timeout
    return kwargs, timeout
