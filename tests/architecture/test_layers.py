"""The house's layers, read from ARCHITECTURE.md: no import cycle and no upward import
anywhere in ``cairn/`` or ``bench/``.

An import counts wherever it is written (a function's lazy import too), except under
``if TYPE_CHECKING:``, which never runs. ``from a.b import c`` counts as an import of the
module ``a.b.c`` when there is one, else of ``a.b``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def layers() -> list[list[str]]:
    """The layers from the top down, each a list of package prefixes (ARCHITECTURE.md's
    ``layers`` block: one line a layer, the top first)."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    block = re.search(r"```text\n# layers.*?\n(.*?)```", text, re.S)
    assert block, "ARCHITECTURE.md has no layers block"
    return [line.split("#")[0].split() for line in block.group(1).splitlines()
            if line.split("#")[0].strip()]


def never_rules() -> list[tuple[str, str]]:
    text = (ROOT / "ARCHITECTURE.md").read_text()
    return re.findall(r"^- `([\w.]+)` never imports `([\w.]+)`", text, re.M)


def modules(folder: str) -> dict[str, Path]:
    found = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        if ".mypy_cache" in path.parts:
            continue
        relative = path.relative_to(ROOT).with_suffix("")
        parts = list(relative.parts)
        if folder == "bench":
            parts = parts[1:]  # bench modules import each other by their bare names
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and (
                (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
                or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")):
            for inner in node.body:
                skip.update(id(n) for n in ast.walk(inner))
    return skip


def imports(path: Path, known: dict[str, Path]) -> Iterator[tuple[str, int]]:
    tree = ast.parse(path.read_text(), str(path))
    skip = _type_checking_nodes(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full in known:
                    yield full, node.lineno
                elif node.module in known:
                    yield node.module, node.lineno


def graph() -> dict[str, set[str]]:
    known = {**modules("cairn"), **modules("bench")}
    return {name: {target for target, _ in imports(path, known) if target != name}
            for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def place(module: str, table: list[list[str]]) -> tuple[int, str]:
    """(height from the bottom, the package prefix) of the longest prefix naming ``module``."""
    best: tuple[int, str] | None = None
    for depth, line in enumerate(table):
        for prefix in line:
            if (module == prefix or module.startswith(prefix + ".")) and (
                    best is None or len(prefix) > len(best[1])):
                best = (len(table) - depth, prefix)
    assert best is not None, f"{module} is in no layer of ARCHITECTURE.md"
    return best


def test_no_import_cycle_in_cairn_or_bench() -> None:
    assert cycles(graph()) == []


def test_every_import_goes_down_the_layers() -> None:
    table = layers()
    assert len(table) >= 10
    upward = []
    for source, targets in graph().items():
        if not source.startswith("cairn"):
            continue
        height, package = place(source, table)
        for target in targets:
            if not target.startswith("cairn"):
                continue
            target_height, target_package = place(target, table)
            if target_height > height or (target_height == height
                                          and target_package != package):
                upward.append(f"{source} -> {target}")
    assert upward == [], "imports that do not go down a layer:\n" + "\n".join(sorted(upward))


def test_the_rules_that_say_never_hold() -> None:
    rules = never_rules()
    assert rules, "ARCHITECTURE.md states no 'never imports' rule"
    broken = [f"{source} -> {target}" for source, targets in graph().items()
              for target in targets for never_from, never_to in rules
              if (source == never_from or source.startswith(never_from + "."))
              and (target == never_to or target.startswith(never_to + "."))]
    assert broken == []


def test_the_checks_find_what_they_look_for() -> None:
    # The checks themselves: a cycle and an upward import are found.
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    table = [["cairn._src.train"], ["cairn._src.storage"]]
    assert place("cairn._src.storage.fileio", table) < place("cairn._src.train.api", table)
