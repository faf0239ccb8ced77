"""The README's tour runs as written (with its storage path pointed at a temp dir)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def tour_code() -> str:
    text = README.read_text()
    tour = text[text.index("## A tour"):]
    match = re.search(r"```python\n(.*?)```", tour, re.S)
    assert match is not None, "the README's tour has no python block"
    return match.group(1)


def test_readme_tour_runs(tmp_path: Path) -> None:
    code = tour_code()
    assert '"/tmp/cairn"' in code
    script = tmp_path / "tour.py"
    # The storage directory beside the script and named `cairn`, there from the start (a
    # second run of a script in /tmp meets the README's /tmp/cairn so): the directory on
    # sys.path must not be imported in place of the installed package.
    storage = tmp_path / "cairn"
    storage.mkdir()
    script.write_text(code.replace('"/tmp/cairn"', repr(str(storage))))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "'epoch': 4" in done.stdout
    assert "goodput" in done.stdout
    kept = sorted(p.name for p in (storage / "my-run").iterdir()
                  if p.name.startswith("checkpoint_"))
    # num_to_keep=2 by lowest loss: the last two epochs (also the latest).
    assert kept == ["checkpoint_000004", "checkpoint_000005"]
