"""A restart that is not counted as a failure (contract item 10: a rank found the checkpoint
it resumed from damaged, and the next attempt falls back) shows as none in every view:
`cairn ls`, ``Result.goodput`` and `cairn goodput`. Real runs, real worker processes."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from test_resume_damage import fit, run_dir

import cairn
from cairn import FailureConfig
from cairn._src.cli.main import main as cli_main
from cairn._src.run.events import Failure, read_events
from cairn._src.storage.location import resolve
from cairn._src.storage.retry import RetryPolicy

RunConfigFactory = Callable[..., cairn.RunConfig]


def test_a_fallback_from_a_damaged_checkpoint_is_no_failure_in_ls_or_goodput(
    run_config: RunConfigFactory, scratch: str, capsys: pytest.CaptureFixture[str],
) -> None:
    config = run_config(failure_config=FailureConfig(max_failures=0))
    fit(config, scratch, steps=3)
    # The same size, other bytes: found only when the rank verifies what it reads.
    state = run_dir(config) / "checkpoint_000003" / "state"
    state.write_bytes(json.dumps({"step": 9}).encode())
    result = fit(config, scratch, steps=4)
    assert result.error is None
    assert Path(scratch, "resumed_at").read_text().split() == ["0", "2"]
    failures = [e for e in read_events(resolve(os.fspath(run_dir(config) / "events")),
                                       RetryPolicy()) if isinstance(e, Failure)]
    assert [f.counted for f in failures] == [False]

    capsys.readouterr()
    assert cli_main(["ls", os.fspath(run_dir(config).parent), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    runs = listed["runs"] if isinstance(listed, dict) else listed
    assert [(r["name"], r["failures"]) for r in runs] == [(config.name, 0)]
    assert result.goodput is not None and result.goodput.failures == 0
    assert "0 failures" in result.goodput.format()
