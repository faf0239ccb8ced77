"""A driver killed with ``kill -9``: its local workers leave, and so do the processes their
train functions started (a ``subprocess``), which the driver's own shutdown would have
ended. Real processes, a real ``kill -9``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

DRIVER = '''\
import os
import subprocess
import sys
import time

import cairn


def train(config):
    child = subprocess.Popen(["sleep", "600"])
    rank = cairn.get_context().get_world_rank()
    with open(os.path.join(config["scratch"], f"child_{rank}.tmp"), "w") as f:
        f.write(str(child.pid))
    os.rename(os.path.join(config["scratch"], f"child_{rank}.tmp"),
              os.path.join(config["scratch"], f"child_{rank}"))
    while True:
        time.sleep(0.1)


if __name__ == "__main__":
    cairn.Trainer(train, train_loop_config={"scratch": sys.argv[2]},
                  scaling_config=cairn.ScalingConfig(num_workers=2),
                  run_config=cairn.RunConfig(name="run", storage_path=sys.argv[1])).fit()
'''


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper has ended)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_processes_a_train_function_started_end_with_a_killed_driver(
        tmp_path: Path) -> None:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    driver = subprocess.Popen([sys.executable, str(script), str(tmp_path / "storage"),
                               str(scratch)], env=env)
    children: list[int] = []
    try:
        deadline = time.monotonic() + 300
        while len(children) < 2:
            assert driver.poll() is None, "the driver ended before its workers started"
            assert time.monotonic() < deadline, "the workers never started their children"
            children = [int((scratch / f"child_{r}").read_text())
                        for r in range(2) if (scratch / f"child_{r}").exists()]
            time.sleep(0.05)
        assert all(_running(pid) for pid in children)
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        deadline = time.monotonic() + 120
        while any(_running(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [pid for pid in children if _running(pid)] == []
    finally:
        if driver.poll() is None:
            driver.kill()
        for pid in children:
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
