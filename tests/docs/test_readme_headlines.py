"""The README's headline figures are those of the results page's section it names."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UNITS = {"µs": 1e-6, "ms": 1e-3, "s": 1.0, "": 1.0}


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def seconds(text: str) -> float:
    number, _, unit = text.strip().partition(" ")
    return float(number) * UNITS[unit]


def test_headlines_match_the_named_section_of_the_results_page() -> None:
    readme = (ROOT / "README.md").read_text()
    match = re.search(r'Headlines from its section\s+"([^"]+)"', readme)
    assert match, "the README names no section of docs/benchmarks.md for its headlines"
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    heading = f"## {match.group(1)}\n"
    assert heading in page, f"docs/benchmarks.md has no section {heading.strip()!r}"
    section = page[page.index(heading) + len(heading):].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        if line.startswith("|") and not line.startswith("|--"):
            row = cells(line)
            rows[row[1]] = row
    table = readme[match.end():readme.index("## A tour")]
    headlines = [cells(line) for line in table.splitlines()
                 if line.startswith("|") and not line.startswith("| ---")][1:]
    assert len(headlines) >= 5
    for metric, cairn, _, ratio in headlines:
        assert metric in rows, f"{metric!r} is not a metric of the section"
        row = rows[metric]
        assert ratio == row[6], f"{metric}: README says {ratio}, the page {row[6]}"
        measured = float(row[2])
        shown = seconds(cairn) if row[5] == "s" else float(cairn)
        assert abs(shown - measured) <= 0.05 * measured, (metric, cairn, row[2])
