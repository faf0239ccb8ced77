"""bench/before_after.py: each tree runs its own benchmark code, side by side, as ratios.

The two trees here are small stand-ins (a ``bench/run_all.py`` each, whose one module
returns a fixed figure), so the test checks the comparison, not a benchmark.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH_DIR))

import before_after  # noqa: E402

RUN_ALL = '''
import argparse, dataclasses
MODULES = {modules!r}
SELECTIONS = {{}}

@dataclasses.dataclass
class Row:
    benchmark: str
    metric: str
    cairn: float | None = None
    reference: float | None = None
    unit: str = "s"

def parse_args(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", action="append")
    return parser.parse_args(argv)

def run_module(name, args):
    if name == "broken":
        raise SystemExit("this module cannot run")
    return [Row(name, "quick" if args.quick else "full", {value}, 4.0)]
'''


def make_tree(root: Path, modules: tuple[str, ...], value: float) -> Path:
    (root / "bench").mkdir(parents=True)
    (root / "bench" / "run_all.py").write_text(RUN_ALL.format(modules=modules, value=value))
    return root


def test_one_module_in_each_tree_gives_its_own_figure(tmp_path: Path) -> None:
    before = make_tree(tmp_path / "before", ("report",), 2.0)
    after = make_tree(tmp_path / "after", ("report", "newer"), 1.0)
    assert before_after.modules(after) == ["report", "newer"]
    assert before_after.run_one(before, "report", quick=True) == [
        {"benchmark": "report", "metric": "quick", "cairn": 2.0, "reference": 4.0,
         "unit": "s"}]
    assert before_after.run_one(after, "report", quick=False)[0]["cairn"] == 1.0


def test_a_module_that_fails_gives_an_error_row_with_its_last_line(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "t", ("broken",), 0.0)
    (row,) = before_after.run_one(tree, "broken", quick=True)
    assert row["metric"] == "error"
    assert "this module cannot run" in str(row["note"])


def test_the_revision_is_exported_without_touching_the_checkout(tmp_path: Path) -> None:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=BENCH_DIR, capture_output=True,
                          text=True, check=True).stdout.strip()
    tree = before_after.export_revision(head, tmp_path)
    assert (tree / "bench" / "run_all.py").is_file()
    assert "report" in before_after.modules(tree)


def test_rounds_below_one_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        before_after.parse_args(["HEAD", "--rounds", "0"])
    assert "--rounds must be an integer >= 1, got 0" in capsys.readouterr().err


def test_the_table_puts_each_figure_before_and_after_with_their_ratios(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    before = make_tree(tmp_path / "before", ("report",), 2.0)
    after = make_tree(tmp_path / "after", ("report", "newer"), 1.0)
    monkeypatch.setattr(before_after, "export_revision", lambda rev, into: before)
    monkeypatch.setattr(before_after, "REPO_ROOT", after)
    before_after.compare("REV", None, quick=True, rounds=2)
    table = capsys.readouterr().out
    assert "| report | quick (s) | 2 | 1 | 0.5x | 0.5x | 0.25x |" in table
    # A module the earlier revision does not have is shown after only.
    assert "| newer | quick (s) | - | 1 | - | - | 0.25x |" in table
