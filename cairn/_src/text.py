"""Small helpers for text people read: counts with the right plural."""

from __future__ import annotations


def plural(count: int, noun: str, plural_form: str | None = None) -> str:
    """``"1 file"``, ``"2 files"``, ``"0 files"``; ``plural_form`` for irregular nouns."""
    return f"{count} {noun if count == 1 else (plural_form or noun + 's')}"
