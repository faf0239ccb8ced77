"""``tests/`` is laid out like the package: each test folder mirrors a folder of
``cairn/_src/``, or is one of the cross-cutting folders CONTRIBUTING.md lists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def documented_extra_folders() -> dict[str, str]:
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    heading = r"```text\n *# test folders outside the package's shape\n(.*?)```"
    block = re.search(heading, text, re.S)
    assert block, "CONTRIBUTING.md lost its block of test folders outside the package's shape"
    folders = {}
    for line in block.group(1).splitlines():
        name, _, why = line.strip().partition(" ")
        if name:
            folders[name] = why.strip()
    return folders


def test_every_test_folder_mirrors_the_package_or_is_documented() -> None:
    package = {p.name for p in (ROOT / "cairn" / "_src").iterdir()
               if p.is_dir() and (p / "__init__.py").exists()}
    extra = documented_extra_folders()
    assert all(extra.values()), f"each extra folder says why it is there: {extra}"
    assert not package & set(extra), "a package folder is listed as an extra folder"
    tests = {p.name for p in (ROOT / "tests").iterdir()
             if p.is_dir() and not p.name.startswith((".", "__"))}
    stray = sorted(tests - package - set(extra))
    assert not stray, (
        f"Test folders {stray} neither mirror a folder of cairn/_src/ nor are listed in "
        "CONTRIBUTING.md: move their tests to the folder of the code they test."
    )
    unused = sorted(set(extra) - tests)
    assert not unused, f"CONTRIBUTING.md lists test folders that do not exist: {unused}"


def test_no_test_package_takes_the_name_of_a_benchmark_module() -> None:
    # pytest puts the folder above a test package on sys.path and imports the package by
    # its name: a package named like a module of bench/ shadows it for the tests that
    # import that module (tests/bench does), depending on the order tests are collected.
    bench = {p.stem for p in (ROOT / "bench").glob("*.py")}
    packages = {p.parent.name for p in (ROOT / "tests").rglob("__init__.py")
                if not (p.parent.parent / "__init__.py").exists()}
    clashes = sorted(packages & bench)
    assert not clashes, f"Test packages {clashes} take the names of modules in bench/."
