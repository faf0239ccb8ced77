"""train_loop_per_worker is called as fn(config) or fn(): a required keyword-only
parameter is refused when the Trainer is built, not in every worker on every restart."""

from __future__ import annotations

from typing import Any

import pytest

from cairn import ConfigError, Trainer


def config_and_keyword(config: dict[str, Any], *, extra: int) -> None: ...


def keyword_config(*, config: dict[str, Any]) -> None: ...


def varargs_and_keyword(*args: Any, config: dict[str, Any]) -> None: ...


@pytest.mark.parametrize(("fn", "name"), [(config_and_keyword, "extra"),
                                          (keyword_config, "config"),
                                          (varargs_and_keyword, "config")])
def test_a_required_keyword_only_parameter_is_refused(fn: Any, name: str) -> None:
    with pytest.raises(ConfigError, match=rf"train_loop_per_worker='{fn.__name__}' has the "
                                          rf"required keyword-only parameter '{name}'"):
        Trainer(fn)


def keyword_with_default(config: dict[str, Any], *, extra: int = 1) -> None: ...


def keyword_kwargs(config: dict[str, Any], **kwargs: Any) -> None: ...


@pytest.mark.parametrize("fn", [keyword_with_default, keyword_kwargs])
def test_keyword_only_parameters_with_defaults_are_accepted(fn: Any) -> None:
    assert Trainer(fn)._pass_config
