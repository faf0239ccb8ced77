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
    table = _first_table(readme[match.end():])
    headlines = [cells(line) for line in table if not line.startswith("| ---")][1:]
    assert len(headlines) >= 5
    for metric, cairn, _, ratio in headlines:
        assert metric in rows, f"{metric!r} is not a metric of the section"
        row = rows[metric]
        assert ratio == row[6], f"{metric}: README says {ratio}, the page {row[6]}"
        measured = float(row[2])
        shown = seconds(cairn) if row[5] == "s" else float(cairn)
        assert abs(shown - measured) <= 0.05 * measured, (metric, cairn, row[2])


def _first_table(text: str) -> list[str]:
    """The lines of the first Markdown table in ``text``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[start:end]


def _section_rows(page: str, heading: str) -> dict[str, list[list[str]]]:
    marker = f"## {heading}\n"
    assert marker in page, f"docs/benchmarks.md has no section {heading!r}"
    section = page[page.index(marker) + len(marker):].split("\n## ", 1)[0]
    # A metric may have several rows, one per reference it is compared with.
    rows: dict[str, list[list[str]]] = {}
    for line in section.splitlines():
        if line.startswith("|") and not line.startswith("|--"):
            rows.setdefault(cells(line)[1], []).append(cells(line))
    return rows


def test_the_at_scale_headlines_match_the_sections_they_name() -> None:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("At scale (checkpoints on S3")
    table = _first_table(readme[start:])
    rows = [cells(line) for line in table if not line.startswith("| ---")][1:]
    assert len(rows) >= 8
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    for metric, heading, cairn, reference, ratio in rows:
        found = _section_rows(page, heading)
        assert metric in found, f"{metric!r} is not a metric of section {heading!r}"
        # The row of the reference the README names: its ratio, and the figures as the
        # page prints them (with the unit after them).
        shown = (ratio, cairn.rsplit(" ", 1)[0], reference.rsplit(" ", 1)[0].rsplit(" ", 1)[-1])
        rows = [(row[6], row[2], row[3]) for row in found[metric]]
        assert shown in rows, f"{metric}: README says {shown}, the page {rows}"


def test_a_newcomer_reads_the_commands_then_the_tour_then_the_contract_then_the_figures() -> None:
    readme = (ROOT / "README.md").read_text()
    order = [readme.index(marker) for marker in
             ("make demo", "## A tour", "## The contract", "## Performance")]
    assert order == sorted(order)
    before_the_tour = readme[:readme.index("## A tour")]
    assert "|" not in before_the_tour, "a table comes before the tour"
    assert "(#performance)" in before_the_tour and "docs/benchmarks.md" in before_the_tour
