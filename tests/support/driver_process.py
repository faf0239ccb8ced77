"""Drivers run as their own processes, so tests can kill -9 them and run them again."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable


def start_script(script: str, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, script, *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def wait_for(predicate: Callable[[], bool], process: subprocess.Popen[bytes],
             timeout: float = 120.0) -> None:
    """Wait until ``predicate()``; fail with the driver's output if it died first."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert process.poll() is None, process.communicate()[0].decode()[-3000:]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def finish(process: subprocess.Popen[bytes]) -> dict[str, object]:
    """The JSON summary a driver prints last; fails with its output if it failed."""
    out, _ = process.communicate(timeout=300)
    assert process.returncode == 0, out.decode()[-5000:]
    summary: dict[str, object] = json.loads(out.decode().strip().splitlines()[-1])
    return summary
