"""The seams between the controller and its backends are typed: what a backend or one of
its worker handles offers is a member of its protocol (``backends/protocol.py``), never
probed with ``getattr``/``hasattr``."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Names under which the controller holds a backend or a worker handle.
SEAM_WORDS = ("backend", "worker", "handle")


def probes(path: Path) -> list[str]:
    """``file:line: call`` of each getattr/hasattr on a backend or worker handle."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr") and node.args):
            continue
        target = ast.unparse(node.args[0])
        if any(word in target.lower() for word in SEAM_WORDS):
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_controller_never_probes_a_backend_or_a_worker_handle() -> None:
    found = [hit for path in sorted((ROOT / "cairn" / "_src" / "controller").rglob("*.py"))
             for hit in probes(path)]
    assert found == [], "add the member to backends/protocol.py instead:\n" + "\n".join(found)


def test_the_check_finds_a_probe(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("def f(worker, backend, config):\n"
                      "    a = getattr(worker, 'preempted', False)\n"
                      "    b = hasattr(self._backend, 'prepare_standby')\n"
                      "    return getattr(config, 'name', None)\n")
    assert probes(sample) == ["sample.py:2: getattr(worker, 'preempted', False)",
                              "sample.py:3: hasattr(self._backend, 'prepare_standby')"]
