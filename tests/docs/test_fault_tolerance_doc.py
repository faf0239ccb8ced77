"""docs/fault-tolerance.md's example is complete code that runs as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import cairn

DOC = Path(__file__).resolve().parents[2] / "docs" / "fault-tolerance.md"


def test_the_preemption_example_runs(tmp_path: Path) -> None:
    match = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert match is not None
    script = tmp_path / "example.py"
    script.write_text(match.group(1).replace('{"steps": 1000}', '{"steps": 50}'))
    storage = tmp_path / "storage"
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env={**os.environ, "CAIRN_STORAGE_PATH": str(storage)},
                          timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # No notice came: no just-in-time checkpoint, no restart.
    result = cairn.Result.from_path(str(storage / "spot-run"))
    assert result.error is None and result.checkpoint is None
