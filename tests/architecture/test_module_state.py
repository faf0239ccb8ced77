"""No module-level mutable state in ``cairn/`` beyond what ARCHITECTURE.md names.

Settings travel in objects that are passed along (``StorageOptions``); a module global
never changes what a call does. What may live at module level is read from
ARCHITECTURE.md's "Module-level state" list (entries `` `folder/module.py` `name` ``), so
the page and the code cannot drift apart. Flagged, unless listed there:

* a name a function rebinds with ``global``;
* a module-level dict, list or set that the module mutates (item assignment or deletion,
  ``append``, ``add``, ``update``, ``setdefault``, ``pop``, ...);
* a module-level name bound to a call whose value is not immutable (a number, a string,
  a tuple, a frozenset, a compiled pattern, a logger, a ``TypeVar``, a class, a sentinel
  with no state of its own, a lock, or an instance of a frozen dataclass).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import logging
import re
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[2]

_MUTATORS = frozenset({"append", "extend", "insert", "add", "update", "setdefault", "pop",
                       "popitem", "clear", "discard", "remove", "__setitem__",
                       "__delitem__"})
_LOCK_TYPES = (type(threading.Lock()), type(threading.RLock()))
_IMMUTABLE = (type(None), bool, int, float, complex, str, bytes, tuple, frozenset,
              re.Pattern, logging.Logger, TypeVar, type, types.FunctionType, *_LOCK_TYPES)


def allowed() -> set[tuple[str, str]]:
    """(module path under cairn/_src or cairn/, name) pairs ARCHITECTURE.md lists."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    section = re.search(r"\*\*Module-level state\*\*(.*?)(?:\n- \*\*|\Z)", text, re.S)
    assert section, "ARCHITECTURE.md has no 'Module-level state' entry"
    pairs = set()
    for line in section.group(1).splitlines():
        found = re.match(r"\s*- `([\w/]+\.py)` ((?:`\w+`(?:, )?)+)", line)
        if found:
            for name in re.findall(r"`(\w+)`", found.group(2)):
                pairs.add((found.group(1), name))
    assert pairs, "ARCHITECTURE.md's 'Module-level state' entry lists no module"
    return pairs


def _key(path: Path) -> str:
    relative = path.relative_to(ROOT / "cairn")
    parts = relative.parts[1:] if relative.parts[0] == "_src" else ("..", *relative.parts)
    return "/".join(parts)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _targets(node: ast.stmt) -> Iterator[tuple[str, ast.expr]]:
    if isinstance(node, ast.Assign):
        for target in node.targets:
            if isinstance(target, ast.Name):
                yield target.id, node.value
    elif isinstance(node, ast.AnnAssign) and node.value is not None and isinstance(
            node.target, ast.Name):
        yield node.target.id, node.value


def _mutated(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [
                node.target]
            for target in targets:
                if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
                    names.add(target.value.id)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in _MUTATORS and isinstance(node.func.value, ast.Name)):
            names.add(node.func.value.id)
    return names


def _immutable(value: Any) -> bool:
    if isinstance(value, _IMMUTABLE) or type(value) is object:
        return True
    if getattr(type(value), "__slots__", None) == () or getattr(value, "__dict__", None) == {}:
        return True  # a sentinel: an object with no state of its own
    kind = type(value)
    return dataclasses.is_dataclass(kind) and kind.__dataclass_params__.frozen  # type: ignore[attr-defined]


def module_state() -> Iterator[tuple[str, str, str]]:
    """(module key, name, why) for every piece of module-level state in cairn/."""
    for path in sorted((ROOT / "cairn").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        key = _key(path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                for name in node.names:
                    yield key, name, f"rebound with 'global' (line {node.lineno})"
        mutated = _mutated(tree)
        calls = []
        for node in tree.body:
            for name, value in _targets(node):
                if name == "__all__":
                    continue
                if isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp,
                                      ast.SetComp)) and name in mutated:
                    yield key, name, f"a container the module mutates (line {node.lineno})"
                elif isinstance(value, ast.Call):
                    calls.append((name, node.lineno))
        if calls:
            module = importlib.import_module(_module_name(path))
            for name, line in calls:
                value = getattr(module, name)
                if not _immutable(value):
                    yield key, name, (f"a {type(value).__name__} made at import "
                                      f"(line {line})")


def test_the_architecture_page_lists_every_piece_of_module_level_state() -> None:
    listed = allowed()
    unlisted = sorted({(key, name, why) for key, name, why in module_state()
                       if (key, name) not in listed})
    assert not unlisted, (
        "Module-level state that ARCHITECTURE.md's 'Module-level state' list does not "
        "name; pass it along in an object instead (StorageOptions, the session), or name "
        "it there if it is a per-process cache:\n"
        + "\n".join(f"  {key} {name}: {why}" for key, name, why in unlisted))


def test_every_listed_piece_still_exists() -> None:
    present = {(key, name) for key, name, _ in module_state()}
    stale = sorted(allowed() - present)
    assert not stale, f"ARCHITECTURE.md lists module-level state that is gone: {stale}"


def test_the_scan_catches_each_kind(tmp_path: Path) -> None:
    tree = ast.parse("x = {}\nx['a'] = 1\ny = []\ny.append(1)\nz = {1: 2}\n"
                     "def f():\n    global w\n    w = 1\n")
    assert _mutated(tree) == {"x", "y"}
    assert not _immutable(threading.Event()) and not _immutable({})
    assert _immutable(re.compile("a")) and _immutable(object()) and _immutable(())
