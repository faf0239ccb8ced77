"""Every bool and int field of every config refuses a value of the wrong type where the
config is built. The cases are found by introspection (dataclasses.fields and the type
hints), so a field added later is covered without anyone listing it."""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from typing import Any

import pytest

import cairn
import cairn.storage
from cairn import ConfigError
from cairn._src.torch.config import TorchConfig  # cairn.torch would import torch


def _config_classes() -> list[type]:
    found: dict[str, type] = {"TorchConfig": TorchConfig}
    for module in (cairn, cairn.storage):
        for name in module.__all__:
            value = getattr(module, name)
            if (isinstance(value, type) and dataclasses.is_dataclass(value)
                    and name.endswith(("Config", "Policy"))):
                found[name] = value
    return [found[name] for name in sorted(found)]


def _kind(hint: Any) -> tuple[type | None, bool]:
    """(bool or int, whether None is accepted) for a field's hint; (None, _) otherwise.
    ``int | tuple[int, int]`` counts as an int field: an int there is checked too."""
    optional = False
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        members = typing.get_args(hint)
        optional = type(None) in members
        for kind in (bool, int):
            if kind in members:
                return kind, optional
        return None, optional
    return (hint, False) if hint in (bool, int) else (None, False)


# Wrong values for each kind: what a YAML file, a command line or a typo hands over.
_WRONG = {bool: ["false", "True", 1, 0, 1.0], int: [True, 2.0, "3", 1.5]}

# Fields not checked yet, each a strict xfail: the entry must go once it is checked.
_KNOWN_GAPS: set[tuple[str, str]] = set()


def _cases() -> list[Any]:
    cases = []
    for cls in _config_classes():
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            kind, _optional = _kind(hints[field.name])
            if kind is None:
                continue
            for value in _WRONG[kind]:
                marks = [pytest.mark.xfail(strict=True, reason="not checked yet")] if (
                    cls.__name__, field.name) in _KNOWN_GAPS else []
                cases.append(pytest.param(cls, field.name, value, marks=marks,
                                          id=f"{cls.__name__}.{field.name}={value!r}"))
    return cases


def test_the_introspection_finds_the_fields_of_the_issue() -> None:
    names = {case.id.partition("=")[0] for case in _cases()}
    assert {"ScalingConfig.use_gpu", "ScalingConfig.num_workers", "ScalingConfig.tls",
            "CheckpointConfig.delete_unmanaged_checkpoints", "CheckpointConfig.num_to_keep",
            "FailureConfig.max_failures", "FailureConfig.warm_standby",
            "RunConfig.log_to_driver", "RunConfig.progress", "RetryPolicy.max_attempts",
            "TransferConfig.part_size"} <= names


@pytest.mark.parametrize(("cls", "name", "value"), _cases())
def test_a_wrong_type_is_refused_where_the_config_is_built(cls: type, name: str,
                                                          value: object) -> None:
    with pytest.raises(ConfigError, match=rf"^{cls.__name__}\.{name}={re.escape(repr(value))} "
                                          r"must be "):
        cls(**{name: value})


def test_the_message_says_what_a_bool_field_accepts() -> None:
    with pytest.raises(ConfigError, match=r"^ScalingConfig\.use_gpu='false' must be a bool "
                                          r"\(True or False\), not str\.$"):
        cairn.ScalingConfig(use_gpu="false")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^RunConfig\.log_to_driver=1 must be a bool "):
        cairn.RunConfig(log_to_driver=1)  # type: ignore[arg-type]


def test_use_gpu_is_checked_before_the_resources_read_it() -> None:
    # "" is falsy: read as use_gpu=False it would blame the GPU in resources_per_worker.
    with pytest.raises(ConfigError, match=r"^ScalingConfig\.use_gpu='' must be a bool"):
        cairn.ScalingConfig(use_gpu="", resources_per_worker={"GPU": 1})  # type: ignore[arg-type]


def test_right_types_and_none_where_allowed_pass() -> None:
    cairn.ScalingConfig(use_gpu=True, tls=None)
    cairn.CheckpointConfig(num_to_keep=None, delete_unmanaged_checkpoints=True)
    cairn.RunConfig(log_to_driver=False, progress=None)
