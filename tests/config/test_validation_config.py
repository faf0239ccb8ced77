"""ValidationConfig and ValidationTaskConfig: Ray Train's names, Cairn's checks."""

from __future__ import annotations

import pytest

from cairn import ConfigError, ReportError, ValidationConfig, ValidationTaskConfig
from cairn._src.config.validation import merged_task, task_for_report


def fn(checkpoint: object, **kwargs: object) -> dict[str, object]:
    return {}


def test_defaults_as_ray() -> None:
    config = ValidationConfig(fn)
    assert config.task_config == ValidationTaskConfig(fn_kwargs={}, timeout_s=None)
    assert config.ray_remote_kwargs == {}
    assert ValidationTaskConfig().fn_kwargs == {}


def test_report_kwargs_override_the_defaults_and_true_takes_the_defaults() -> None:
    config = ValidationConfig(fn, ValidationTaskConfig(fn_kwargs={"a": 1, "b": 2}, timeout_s=5))
    assert merged_task(config, task_for_report(True) or {}) == ({"a": 1, "b": 2}, 5)
    task = task_for_report(ValidationTaskConfig(fn_kwargs={"b": 3}))
    assert task == {"fn_kwargs": {"b": 3}, "timeout_s": None}
    assert merged_task(config, task) == ({"a": 1, "b": 3}, None)
    assert task_for_report(False) is None


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: ValidationTaskConfig(timeout_s=0), r"timeout_s=0 must be None \(no timeout\) "
                                                    r"or a number of seconds > 0"),
        (lambda: ValidationTaskConfig(fn_kwargs={"x": object()}),
         r"fn_kwargs=\{'x': <object object at .*>\} is not JSON-serializable"),
        (lambda: ValidationTaskConfig(fn_kwargs=[1]),  # type: ignore[arg-type]
         r"fn_kwargs=\[1\] must be a dict of argument names"),
        (lambda: ValidationConfig("fn"),  # type: ignore[arg-type]
         r"ValidationConfig\(fn='fn'\) must be a function"),
        (lambda: ValidationConfig(fn, task_config={}),  # type: ignore[arg-type]
         r"task_config=\{\}\) must be a ValidationTaskConfig or None"),
    ],
)
def test_bad_values_are_refused_with_a_clear_message(make: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make()  # type: ignore[operator]


def test_bad_validation_argument_of_report() -> None:
    with pytest.raises(ReportError, match=r"report\(validation='yes'\) must be True, False or "
                                          r"a cairn.ValidationTaskConfig"):
        task_for_report("yes")
