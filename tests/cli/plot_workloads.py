"""Train functions of the ``cairn plot`` and ``cairn verify`` tests over real runs (the
workers import them by this module's name)."""

from __future__ import annotations

from typing import Any

import cairn

# A metric that diverged: the largest finite doubles, either sign, then small again.
HUGE = (1.0, 1.7976931348623157e308, -1.7976931348623157e308, 2.0)


def diverge(config: dict[str, Any]) -> None:
    for step, value in enumerate(HUGE):
        cairn.report({"step": step, "g": value, "flat": 1e308})
