"""The files the README and docs/ point a reader to exist (tests, examples, benchmarks):
a test moved or renamed must take its mentions with it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_MENTION = re.compile(r"(?<![\w/.])((?:tests|examples|bench)/[\w/.-]*\w)")


def test_every_file_the_docs_name_exists() -> None:
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
    missing = []
    for page in pages:
        if not page.exists():
            continue
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for mention in _MENTION.findall(line):
                path = mention.split("::")[0]
                if not (ROOT / path).exists():
                    missing.append(f"{page.relative_to(ROOT)}:{number}: {path}")
    assert not missing, "\n".join(missing)
