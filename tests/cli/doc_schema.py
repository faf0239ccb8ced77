"""The JSON schemas docs/cli.md documents, read from the page itself, and a checker.

The notation (docs/cli.md, "--json"): ``str``, ``int`` (an integer, never a bool),
``float`` (any number), ``bool``, ``null``, ``object`` (any object), ``"literal"``,
``[T]``, ``{"key": T, ...}`` (exactly these keys), ``A | B``; ``(...)`` is a comment.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
_BLOCK = re.compile(r"<!-- schema: ([\w-]+) -->\n```\n(.*?)```", re.S)
_TOKEN = re.compile(r'\s*(?:(\()|("(?:[^"\\]|\\.)*")|([A-Za-z_]+)|([\[\]{}:,|]))')


@dataclass(frozen=True)
class Node:
    kind: str  # a type name, "literal", "list", "object" or "union"
    value: Any = None


def documented_schemas() -> dict[str, Node]:
    """Every ``<!-- schema: NAME -->`` block of docs/cli.md, parsed."""
    return {name: parse(text) for name, text in _BLOCK.findall(DOC.read_text())}


def _tokens(text: str) -> list[str]:
    tokens, at = [], 0
    while at < len(text):
        if text[at:].strip() == "":
            break
        match = _TOKEN.match(text, at)
        assert match, f"cannot read the schema at {text[at:at + 40]!r}"
        if match.group(1):  # a comment, to its matching parenthesis
            depth, at = 1, match.end()
            while depth:
                depth += {"(": 1, ")": -1}.get(text[at], 0)
                at += 1
            continue
        tokens.append(next(g for g in match.groups()[1:] if g))
        at = match.end()
    return tokens


def parse(text: str) -> Node:
    tokens = _tokens(text)
    node, rest = _union(tokens)
    assert not rest, f"unexpected {rest[:3]} after the schema"
    return node


def _union(tokens: list[str]) -> tuple[Node, list[str]]:
    options = []
    node, tokens = _one(tokens)
    options.append(node)
    while tokens and tokens[0] == "|":
        node, tokens = _one(tokens[1:])
        options.append(node)
    return (options[0] if len(options) == 1 else Node("union", tuple(options))), tokens


def _one(tokens: list[str]) -> tuple[Node, list[str]]:
    head, tokens = tokens[0], tokens[1:]
    if head.startswith('"'):
        return Node("literal", json.loads(head)), tokens
    if head == "[":
        item, tokens = _union(tokens)
        assert tokens[0] == "]", tokens[:3]
        return Node("list", item), tokens[1:]
    if head == "{":
        fields: dict[str, Node] = {}
        while tokens[0] != "}":
            key, colon = json.loads(tokens[0]), tokens[1]
            assert colon == ":", tokens[:3]
            fields[key], tokens = _union(tokens[2:])
            if tokens[0] == ",":
                tokens = tokens[1:]
        return Node("object", fields), tokens[1:]
    assert head in ("str", "int", "float", "bool", "null", "object"), head
    return Node(head), tokens


def problems(value: Any, node: Node, where: str = "$") -> list[str]:
    """What in ``value`` does not match ``node``: empty when it matches."""
    kind = node.kind
    if kind == "union":
        found = [problems(value, option, where) for option in node.value]
        return [] if any(not f for f in found) else min(found, key=len)
    if kind == "literal":
        return [] if value == node.value else [f"{where}: {value!r} is not {node.value!r}"]
    if kind == "list":
        if not isinstance(value, list):
            return [f"{where}: {type(value).__name__} is not a list"]
        return [p for i, item in enumerate(value) for p in problems(item, node.value,
                                                                    f"{where}[{i}]")]
    if kind == "object" and node.value is None:
        return [] if isinstance(value, dict) else [f"{where}: not an object"]
    if kind == "object":
        if not isinstance(value, dict):
            return [f"{where}: {type(value).__name__} is not an object"]
        keys = set(value) ^ set(node.value)
        if keys:
            return [f"{where}: keys {sorted(keys)} are missing or undocumented"]
        return [p for key, sub in node.value.items()
                for p in problems(value[key], sub, f"{where}.{key}")]
    accepted = {
        "str": lambda v: isinstance(v, str),
        "int": lambda v: type(v) is int,
        "float": lambda v: type(v) in (int, float),
        "bool": lambda v: type(v) is bool,
        "null": lambda v: v is None,
    }[kind]
    return [] if accepted(value) else [f"{where}: {value!r} is not {kind}"]


def check(document: Any, name: str) -> None:
    """Fail with every mismatch when ``document`` does not match the schema ``name``."""
    found = problems(document, documented_schemas()[name])
    assert not found, f"cairn {name} --json does not match docs/cli.md:\n" + "\n".join(found)
