"""A train function or config that cannot be pickled is refused by ``Trainer(...)``, naming
the variable that holds what cannot be (issue 25 item 7)."""

from __future__ import annotations

import functools
import textwrap
import threading
from typing import Any

import pytest

import cairn
from cairn import ConfigError, Trainer

_FIXES = r"Create the object inside the train function, pass it in train_loop_config"


def _script_function(source: str, **names: Any) -> Any:
    """A function defined in a script run as ``__main__``: cloudpickle pickles it, and
    the globals it reads, by value (as it does for a user's script)."""
    namespace: dict[str, Any] = {"__name__": "__main__", "cairn": cairn, **names}
    exec(textwrap.dedent(source), namespace)
    return namespace["train_func"]


def test_a_lock_in_a_global_is_named() -> None:
    train_func = _script_function("""
        def train_func():
            with LOCK:
                cairn.report({"x": 1})
    """, LOCK=threading.Lock())
    with pytest.raises(ConfigError, match=(
            r"^train_loop_per_worker=train_func cannot be pickled to send it to the worker "
            r"processes: the global variable 'LOCK' holds a _thread\.lock \(TypeError: "
            rf"cannot pickle '_thread\.lock' object\)\. {_FIXES}")):
        Trainer(train_func)


def test_a_lock_in_a_global_a_helper_function_reads_is_named_through_it() -> None:
    train_func = _script_function("""
        def helper():
            with LOCK:
                return 1

        def train_func():
            cairn.report({"x": helper()})
    """, LOCK=threading.Lock())
    with pytest.raises(ConfigError, match=r"the global variable 'LOCK' of the global "
                                          r"variable 'helper' holds a _thread\.lock"):
        Trainer(train_func)


def test_a_lock_in_a_closure_is_named() -> None:
    lock = threading.Lock()

    def train_func() -> None:
        with lock:
            cairn.report({"x": 1})

    with pytest.raises(ConfigError, match=(
            r"^train_loop_per_worker=test_a_lock_in_a_closure_is_named\.<locals>\.train_func "
            r"cannot be pickled .*: the closure variable 'lock' holds a _thread\.lock "
            rf"\(TypeError: .*\)\. {_FIXES}")):
        Trainer(train_func)


def test_a_lock_in_a_partial_argument_is_named() -> None:
    def train_func(config: dict[str, Any], guard: Any) -> None:
        cairn.report({"x": 1})

    with pytest.raises(ConfigError, match=r"the partial keyword argument 'guard' holds a "
                                          r"_thread\.lock"):
        Trainer(functools.partial(train_func, guard=threading.Lock()))


def test_a_lock_in_train_loop_config_is_named() -> None:
    def train_func(config: dict[str, Any]) -> None:
        cairn.report({"x": 1})

    with pytest.raises(ConfigError, match=(
            r"^train_loop_config cannot be pickled to send it to the worker processes: "
            r"train_loop_config\['lock'\] holds a _thread\.lock \(TypeError: cannot pickle "
            rf"'_thread\.lock' object\)\. {_FIXES}")):
        Trainer(train_func, train_loop_config={"lr": 0.1, "lock": threading.Lock()})


def test_a_lock_nested_in_train_loop_config_is_named_by_its_keys() -> None:
    def train_func(config: dict[str, Any]) -> None:
        cairn.report({"x": 1})

    with pytest.raises(ConfigError, match=r"train_loop_config\['sync'\]\[1\] holds a "
                                          r"_thread\.lock"):
        Trainer(train_func, train_loop_config={"sync": [1, threading.Lock()]})


def test_a_factory_of_the_object_is_accepted() -> None:
    def train_func(config: dict[str, Any]) -> None:
        with config["make_lock"]():
            cairn.report({"x": 1})

    Trainer(train_func, train_loop_config={"make_lock": threading.Lock})
