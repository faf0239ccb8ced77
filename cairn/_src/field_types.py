"""The type check every config dataclass runs on its ``bool`` and ``int`` fields.

A config is built in the driver; a wrong type found only in a worker seconds later, with
a message quoting a different value (``"false"`` is truthy), is a mistake caught in the
wrong place. :func:`check_field_types` reads the fields' type hints, so a field added
later is checked without anyone remembering to.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any

from cairn._src.errors import ConfigError


@functools.cache
def _kinds(cls: type) -> tuple[tuple[str, type, bool], ...]:
    """``(field name, bool or int, whether None is accepted)`` for every field of the
    dataclass ``cls`` whose type hint is exactly ``bool``, ``int``, or one of them
    ``| None``. A union with anything else (``int | tuple[int, int]``) has its own check."""
    hints = typing.get_type_hints(cls)
    found = []
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        optional = False
        if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
            members = [m for m in typing.get_args(hint) if m is not type(None)]
            optional = len(members) < len(typing.get_args(hint))
            if len(members) != 1:
                continue
            hint = members[0]
        if hint is bool or hint is int:
            found.append((field.name, hint, optional))
    return tuple(found)


def check_field_types(config: Any) -> None:
    """Raise :class:`ConfigError` for a ``bool`` field that holds anything but ``True`` or
    ``False`` (``"false"``, ``0``) or an ``int`` field that holds a bool, a float or a
    string, naming the class, the field and the value. ``None`` passes where the hint
    allows it."""
    cls: type = type(config)
    for name, kind, optional in _kinds(cls):
        value = getattr(config, name)
        if value is None and optional:
            continue
        alternative = " or None" if optional else ""
        if kind is bool and not isinstance(value, bool):
            raise ConfigError(
                f"{cls.__name__}.{name}={value!r} must be a bool (True or False"
                f"{alternative}), not {type(value).__name__}."
            )
        if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(
                f"{cls.__name__}.{name}={value!r} must be an integer{alternative}, not "
                f"{type(value).__name__}; write a whole number such as 3."
            )
