"""The live view under a real pseudo-terminal, with logging configured before ``fit()`` (as
almost every script, and ``make demo``, does): every log record and every line of worker
output prints whole above the status panel, and no stale panel stays in the scrollback."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from terminal import replay, run_in_terminal

DRIVER = '''\
import logging

logging.basicConfig(level=logging.INFO)

import cairn


def train_func():
    context = cairn.get_context()
    cairn.report({{"step": 0}})
    print("worker output from attempt", context.get_attempt(), flush=True)
    if context.get_attempt() == 0 and context.get_world_rank() == 0:
        raise RuntimeError("the first attempt fails: no shards in [/mnt/data/a.bin]")


if __name__ == "__main__":
    cairn.Trainer(train_func, scaling_config=cairn.ScalingConfig(num_workers=2),
                  run_config=cairn.RunConfig(
                      name="run", storage_path={storage!r}, progress=1,
                      failure_config=cairn.FailureConfig(max_failures=1))).fit()
    print("the script ends")
'''


def test_a_warning_logged_during_the_live_view_prints_whole_above_it(tmp_path: Path) -> None:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER.format(storage=str(tmp_path / "storage")))
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "160", "LINES": "50",
           "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    env.pop("CAIRN_PROGRESS", None)
    env.pop("NO_COLOR", None)
    code, output = run_in_terminal(str(script), env)
    lines = replay(output)
    text = "\n".join(lines)
    assert code == 0, text
    warning = [line for line in lines if "Attempt 0 failed (" in line]
    assert len(warning) == 1, text
    assert warning[0].startswith("WARNING:cairn._src.controller.controller:Attempt 0 failed "
                                 "([rank 0] RuntimeError: the first attempt fails"), text
    assert warning[0].endswith("failure 1 of 1 allowed: RETRY"), text
    # Worker output, whole, on lines of its own.
    assert "(rank 0) worker output from attempt 0" in lines, text
    assert "(rank 1) worker output from attempt 1" in lines, text
    # One panel: the final one, after everything else; none left behind in the scrollback.
    panel = [i for i, line in enumerate(lines) if line.startswith("uploads ")]
    assert len(panel) == 1, text
    assert lines.index("the script ends") > panel[0], text
    # The panel shows the failure as raised, brackets and all (not read as markup: a
    # closing tag it does not know would stop the panel's updates).
    restarts = [line for line in lines if line.startswith("restarts ")]
    assert len(restarts) == 1, text
    assert restarts[0].split(None, 1)[1].startswith(
        "1 restart (last: [rank 0] RuntimeError: the first attempt fails: no shards in "
        "[/mnt/data/a.bin]"), text
