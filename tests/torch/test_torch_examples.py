"""The torch examples run end to end (shortened), crash included, as users run them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(script: str, *args: str) -> str:
    completed = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        capture_output=True, text=True, timeout=240, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output
    return output


def test_demo_recovers_from_the_injected_crash(tmp_path: Path) -> None:
    output = run_example("demo.py", "--epochs", "3", "--crash-epoch", "1",
                         "--storage", str(tmp_path))
    assert "injecting a crash: kill -9 of rank 1 at epoch 1" in output
    assert "attempt 1: resumed from checkpoint_" in output
    assert "attempts          2 (1 failure, recovered)" in output
    assert "(checksums verified)" in output and "goodput" in output


@pytest.mark.parametrize("mode", ["upload-fn", "no-upload"])
def test_dcp_async_save_is_registered_and_resumed(mode: str, tmp_path: Path) -> None:
    output = run_example("torch_dcp_async.py", "--mode", mode, "--steps", "12", "--every", "4",
                         "--crash-at", "9", "--storage", str(tmp_path))
    # The save of step 8 may still be running when rank 1 dies at step 9: with NO_UPLOAD
    # it is reported only at the next save, so the resume is from step 4; through the
    # upload function it commits as soon as DCP finishes, so from step 4 or 8.
    resumed = re.search(r"attempt 1: resumed at step (\d+)", output)
    assert resumed is not None, output
    assert int(resumed.group(1)) in ((4,) if mode == "no-upload" else (4, 8))
    assert f"mode {mode}: finished at step 12" in output
    # The 2 latest (steps 8 and 12): the one resumed from was protected only until the
    # attempt committed a newer one.
    assert output.count("kept (verified)") == 2
