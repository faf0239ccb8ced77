"""What the set-up installs: `make demo` what the demo imports, `make test` the rest; cleanly.

Read from `make -n -B` (print every command, run none) with the venv pointed elsewhere.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def installs(target: str, tmp_path: Path) -> list[str]:
    """The extras and packages each `pip install` of ``target`` asks for, in order."""
    done = subprocess.run(["make", "-n", "-B", target, f"VENV={tmp_path / 'venv'}"],
                          cwd=ROOT, capture_output=True, text=True, check=True)
    asked = []
    for line in done.stdout.splitlines():
        if " pip install " in line and "--upgrade pip" not in line:
            asked += re.findall(r"-e '([^']+)'|(torch==\S+)", line)
    return [extra or pin for extra, pin in asked]


def test_make_demo_installs_cairn_with_torch_only(tmp_path: Path) -> None:
    assert installs("demo", tmp_path) == ["torch==2.13.0", ".[torch]"]


def test_make_test_installs_every_extra_the_tests_use(tmp_path: Path) -> None:
    asked = installs("unit", tmp_path)
    full = next(a for a in asked if a.startswith(".[dev"))
    for extra in ("dev", "torch", "ray", "pandas", "plot", "huggingface", "lightning"):
        assert extra in full[2:-1].split(","), (extra, full)
    assert "examples/xyzstorage" in subprocess.run(
        ["make", "-n", "-B", "unit", f"VENV={tmp_path / 'venv'}"], cwd=ROOT,
        capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("pyproject", ["pyproject.toml", "examples/xyzstorage/pyproject.toml"])
def test_licenses_are_spdx_strings_so_installing_prints_no_deprecation(pyproject: str) -> None:
    # setuptools >= 77 warns at every build about a `license = { text = ... }` table.
    tomllib = pytest.importorskip("tomllib")
    document = tomllib.loads((ROOT / pyproject).read_text())
    assert isinstance(document["project"]["license"], str)
    requires = " ".join(document["build-system"]["requires"])
    assert "setuptools>=77" in requires
