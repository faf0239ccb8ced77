"""What every benchmark module shares: Ray references for its rows, and its ``main``."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

import _harness
import _ray_reference as ray_ref

Row = _harness.Row


def summary_line(doc: str | None) -> str:
    return (doc or "").split("\n\n")[0]


def parse_args(doc: str | None, argv: Sequence[str] | None = None) -> Any:
    return _harness.parse_module_args(summary_line(doc), argv)


def references(args: Any, groups: Sequence[str]) -> list[Row] | None:
    """Ray Train 2.60's rows for ``groups``; None with ``--no-ray`` or without Ray."""
    if getattr(args, "no_ray", False) or ray_ref.ray_version() is None:
        return None
    return ray_ref.reference_rows(quick=getattr(args, "quick", False), groups=tuple(groups))


def with_references(rows: list[Row], args: Any, groups: Sequence[str]) -> list[Row]:
    """``rows`` with Ray's figures filled in as their references, where Ray measures them."""
    reference = references(args, groups)
    return rows if reference is None else _harness.fill_references(rows, reference)


def module_main(doc: str | None, run: Callable[[Any], list[Row]],
                argv: Sequence[str] | None = None) -> int:
    """Run one benchmark module from the command line and print its table."""
    logging.basicConfig(level=logging.INFO, format="[bench] %(message)s", stream=sys.stderr)
    rows = run(parse_args(doc, argv))
    _harness.print_table(rows)
    return 1 if any(_harness.is_error_row(row) for row in rows) else 0
