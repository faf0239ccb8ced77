"""No module in ``cairn/`` over 600 lines: a module that grows past it splits by concept."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 600


def test_no_module_under_cairn_is_over_600_lines() -> None:
    too_long = {}
    for path in sorted((ROOT / "cairn").rglob("*.py")):
        with path.open(encoding="utf-8") as f:
            lines = sum(1 for _ in f)
        if lines > MAX_LINES:
            too_long[str(path.relative_to(ROOT))] = lines
    assert not too_long, (
        f"Modules over {MAX_LINES} lines: {too_long}. Split each by concept into modules "
        f"of at most {MAX_LINES} lines (see ARCHITECTURE.md)."
    )
