"""Ray Train names as the ported tests import them, resolved from Cairn's public modules.

``from ray.train import X`` and ``from ray.train.v2.api.<module> import X`` become
``from ray_suite.cairn_names import X``: each name is looked up in :mod:`cairn`, then in
:mod:`cairn.torch`, under the same name (``DataParallelTrainer`` is Cairn's ``Trainer``,
the one rename). A name Cairn does not have yet resolves to a :class:`Missing` stand-in,
so the module still imports and only the tests that use the name fail, with an error
naming it; their xfail reasons name the missing feature.
"""

from __future__ import annotations

from typing import Any

import cairn
import cairn.torch

RENAMED = {"DataParallelTrainer": "Trainer"}


class MissingNameError(AttributeError):
    """A ported test used a Ray Train name that Cairn does not have."""


class Missing:
    """Stands in for a name Cairn lacks. Calling it gives another stand-in (so that a
    parametrize list can build one at import time); using its attributes fails."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Missing:
        return Missing(f"{self._name}(...)")

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        raise MissingNameError(f"cairn has no {self._name} (used: .{attribute})")

    def __repr__(self) -> str:
        return f"Missing({self._name})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Missing, (self._name,))


def resolve(name: str) -> Any:
    """The Cairn object for the Ray Train name ``name``, or a :class:`Missing`."""
    target = RENAMED.get(name, name)
    for module in (cairn, cairn.torch):
        if hasattr(module, target):
            return getattr(module, target)
    return Missing(name)


def missing_names(names: list[str]) -> list[str]:
    """The names of ``names`` that Cairn does not have."""
    return [name for name in names if isinstance(resolve(name), Missing)]


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    return resolve(name)
