"""Inputs that used to pass construction and fail later, naming the wrong thing: each is
refused (or normalised) where the config is built."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from cairn import (
    ConfigError,
    FailureConfig,
    RunConfig,
    UserCallback,
    ValidationConfig,
    ValidationTaskConfig,
)
from cairn._src.config.run import default_storage_path
from cairn._src.config.validation import merged_task


def _fn(checkpoint: object, **kwargs: object) -> dict[str, object]:
    return {}


# ValidationTaskConfig.timeout_s: inf is no timeout; beyond threading.TIMEOUT_MAX refused.

def test_an_infinite_validation_timeout_means_no_timeout() -> None:
    config = ValidationTaskConfig(timeout_s=float("inf"))
    assert config.timeout_s is None
    assert config.to_json() == {"fn_kwargs": {}, "timeout_s": None}
    assert merged_task(ValidationConfig(_fn, config), {}) == ({}, None)


def test_a_validation_timeout_longer_than_a_thread_can_wait_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"ValidationTaskConfig\.timeout_s=1e\+20 is longer "
                                          r"than a thread can wait.*TIMEOUT_MAX"):
        ValidationTaskConfig(timeout_s=1e20)
    assert ValidationTaskConfig(timeout_s=threading.TIMEOUT_MAX).timeout_s == (
        threading.TIMEOUT_MAX)


def test_a_persisted_task_with_an_endless_timeout_waits_without_one() -> None:
    config = ValidationConfig(_fn)
    assert merged_task(config, {"timeout_s": float("inf")}) == ({}, None)
    assert merged_task(config, {"timeout_s": 1e20}) == ({}, None)
    assert merged_task(config, {"timeout_s": 5}) == ({}, 5)


# RunConfig.callbacks: a class instead of an instance.

class MyCallback(UserCallback):
    pass


def test_a_callback_class_is_refused_with_the_instance_to_pass() -> None:
    with pytest.raises(ConfigError, match=r"RunConfig\.callbacks contains the class "
                                          r"MyCallback, not an instance of it: pass "
                                          r"MyCallback\(\) instead"):
        RunConfig(callbacks=[MyCallback])
    assert RunConfig(callbacks=[MyCallback()]).callbacks


# RunConfig.name and storage_path: NUL characters, over-long names.

def test_a_nul_in_the_run_name_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"RunConfig\.name='a\\x00b' must be a str without "
                                          "NUL characters"):
        RunConfig(name="a\0b")


@pytest.mark.parametrize("path", ["/tmp/a\0b", Path("/tmp/a\0b")])
def test_a_nul_in_the_storage_path_is_refused(path: str | os.PathLike[str]) -> None:
    with pytest.raises(ConfigError, match=r"RunConfig\.storage_path=.*a\\x00b.* without NUL"):
        RunConfig(storage_path=path)


def test_a_run_name_longer_than_a_directory_name_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"RunConfig\.name='x{256}' is 256 bytes long"):
        RunConfig(name="x" * 256)
    with pytest.raises(ConfigError, match=r"is 256 bytes long"):
        RunConfig(name="é" * 128)  # 2 bytes each in UTF-8
    assert RunConfig(name="x" * 255).name == "x" * 255


# CAIRN_STORAGE_PATH: blank is unset.

@pytest.mark.parametrize("value", ["", "   ", "\t\n"])
def test_a_blank_storage_path_variable_means_the_default(
        value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAIRN_STORAGE_PATH", value)
    assert default_storage_path() == os.path.expanduser("~/cairn_results")


def test_the_storage_path_variable_is_used_when_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAIRN_STORAGE_PATH", "/data/runs")
    assert default_storage_path() == "/data/runs"
    monkeypatch.delenv("CAIRN_STORAGE_PATH")
    assert default_storage_path() == os.path.expanduser("~/cairn_results")


@pytest.mark.parametrize("field", ["collective_timeout_s", "preemption_deadline_s",
                                   "stop_timeout_s", "preemption_grace_s"])
@pytest.mark.parametrize("value", [10**400, float("inf"), 1e12])
def test_a_wait_no_thread_can_take_is_refused(field: str, value: object) -> None:
    # 10**400 passed the checks and overflowed in float() inside the controller.
    with pytest.raises(ConfigError, match=rf"FailureConfig\.{field}=.* must be a (finite "
                                          r"number of seconds, at most \d+\.|number >= 0)"):
        FailureConfig(**{field: value})
