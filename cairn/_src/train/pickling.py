"""Checks, in the driver, that the train function and its config can travel to workers.

Both are pickled with cloudpickle when ``fit()`` starts its workers. An object that cannot
be pickled (a lock, an open file, a database connection) would otherwise fail there with a
bare ``TypeError: cannot pickle '_thread.lock' object`` that names neither the function
nor the variable. :func:`check_train_fn_picklable` and :func:`check_config_picklable`
raise a :class:`ConfigError` at ``Trainer(...)`` naming the variable that holds it.
"""

from __future__ import annotations

import functools
import logging
import types
from collections.abc import Iterator, Mapping

import cloudpickle

from cairn._src.errors import ConfigError

logger = logging.getLogger(__name__)

_FIXES = (
    "Create the object inside the train function, pass it in train_loop_config if it can "
    "be pickled, or pass a zero-argument function that creates it (a factory) and call "
    "that inside the train function."
)

# How deep the search for the culprit follows functions that reference functions.
_MAX_DEPTH = 8


def _pickle_error(value: object) -> BaseException | None:
    try:
        cloudpickle.dumps(value)
    except Exception as exc:  # cloudpickle raises TypeError, PicklingError, AttributeError...
        return exc
    return None


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _type_name(value: object) -> str:
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else (
        f"{kind.__module__}.{kind.__qualname__}")


def _global_names(code: types.CodeType) -> Iterator[str]:
    """The global names ``code`` and the functions and classes nested in it may read."""
    yield from code.co_names
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from _global_names(constant)


def _parts(value: object) -> Iterator[tuple[str, object]]:
    """``(how it is reached, object)`` for what pickling ``value`` by value pickles."""
    if isinstance(value, functools.partial):
        yield "partial function", value.func
        for position, argument in enumerate(value.args):
            yield f"partial argument {position}", argument
        for name, argument in value.keywords.items():
            yield f"partial keyword argument {name!r}", argument
        return
    if isinstance(value, types.MethodType):
        yield "object the method is bound to", value.__self__
        yield "method function", value.__func__
        return
    if isinstance(value, types.FunctionType):
        cells = value.__closure__ or ()
        for name, cell in zip(value.__code__.co_freevars, cells, strict=False):
            try:
                contents = cell.cell_contents
            except ValueError:  # an empty cell: the variable is not assigned yet
                continue
            yield f"closure variable {name!r}", contents
        seen = set()
        for name in _global_names(value.__code__):
            if name in seen or name not in value.__globals__:
                continue
            seen.add(name)
            found = value.__globals__[name]
            if not isinstance(found, types.ModuleType):  # modules travel by name
                yield f"global variable {name!r}", found
        for name, default in zip(value.__code__.co_varnames, value.__defaults__ or (),
                                 strict=False):
            yield f"default argument {name!r}", default
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            yield f"[{key!r}]", item
        return
    if isinstance(value, (list, tuple, set, frozenset)):
        for position, item in enumerate(value):
            yield f"[{position}]", item
        return
    attributes = getattr(value, "__dict__", None)
    if isinstance(attributes, dict):
        for name, item in attributes.items():
            yield f"attribute {name!r}", item


def _culprit(value: object, depth: int = 0) -> tuple[list[str], object] | None:
    """The path to the innermost part of ``value`` that cannot be pickled, and that part;
    None when no part alone fails (``value`` itself is the culprit)."""
    if depth >= _MAX_DEPTH:
        return None
    for how, part in _parts(value):
        if _pickle_error(part) is None:
            continue
        deeper = _culprit(part, depth + 1)
        if deeper is None:
            return [how], part
        path, found = deeper
        return [how, *path], found
    return None


def _joined(path: list[str], root: str = "") -> str:
    """``["global variable 'cfg'", "['lock']"]`` as ``global variable 'cfg'['lock']``, and
    a path through several objects innermost first: ``attribute 'x' of global variable
    'model'``."""
    steps: list[str] = [root] if root else []
    for step in path:
        if step.startswith("[") and steps:
            steps[-1] += step
        else:
            steps.append(step)
    return " of the ".join(reversed(steps))


def check_train_fn_picklable(fn: object, *, argument: str = "train_loop_per_worker") -> None:
    """Raise :class:`ConfigError` when ``fn`` cannot be pickled, naming the closure or
    global variable (or partial argument, attribute ...) that holds what cannot be."""
    error = _pickle_error(fn)
    if error is None:
        return
    name = getattr(fn, "__qualname__", None) or repr(fn)
    found = _culprit(fn)
    where = ""
    if found is not None:
        path, part = found
        where = f": the {_joined(path)} holds a {_type_name(part)}"
    raise ConfigError(
        f"{argument}={name} cannot be pickled to send it to the worker processes{where} "
        f"({_describe(error)}). {_FIXES}"
    ) from error


def check_config_picklable(config: object, *, argument: str = "train_loop_config") -> None:
    """Raise :class:`ConfigError` when ``config`` cannot be pickled, naming the key that
    holds what cannot be."""
    error = _pickle_error(config)
    if error is None:
        return
    found = _culprit(config)
    where = ""
    if found is not None:
        path, part = found
        where = f": {_joined(path, argument)} holds a {_type_name(part)}"
    raise ConfigError(
        f"{argument} cannot be pickled to send it to the worker processes{where} "
        f"({_describe(error)}). {_FIXES}"
    ) from error
