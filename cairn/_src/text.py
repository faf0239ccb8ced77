"""Small helpers for text people read: counts with the right plural, and text read from
storage made safe to print."""

from __future__ import annotations

import re

# C0 and C1 control characters and DEL: names and values read from storage can carry ESC or
# BEL, which a terminal would obey (erase a line, move the cursor) instead of print; and
# lone surrogates (JSON may spell one), which no encoding writes.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def plural(count: int, noun: str, plural_form: str | None = None) -> str:
    """``"1 file"``, ``"2 files"``, ``"0 files"``; ``plural_form`` for irregular nouns."""
    return f"{count} {noun if count == 1 else (plural_form or noun + 's')}"


def _escape(match: re.Match[str]) -> str:
    return ascii(match.group())[1:-1]


def printable(text: object) -> str:
    """``str(text)`` with every control character (and lone surrogate) escaped as Python
    writes it (``\\x1b``, ``\\n``), for human-readable output of anything read from
    storage. JSON output needs no such step: JSON escapes them itself."""
    return _UNPRINTABLE.sub(_escape, str(text))


def printable_lines(text: object) -> str:
    """:func:`printable` line by line: the line breaks of ``text`` stay line breaks."""
    return "\n".join(printable(line) for line in str(text).split("\n"))
