"""A RunConfig that was pickled (built in one process, sent to the one that calls
``fit()``, as a Ray task or a subprocess receives it) runs as the original does."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

import cairn
from cairn import RunConfig, ScalingConfig, Trainer


def _train() -> None:
    cairn.report({"loss": 1})


def test_a_local_mode_run_takes_a_pickled_run_config(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # fit() in local mode turns the live view off with dataclasses.replace when neither
    # RunConfig(progress=) nor CAIRN_PROGRESS asks for it; a pickled RunConfig failed
    # there with "`RunConfig(verbose)` is deprecated" though verbose was not given.
    monkeypatch.delenv("CAIRN_PROGRESS", raising=False)
    config = pickle.loads(pickle.dumps(RunConfig(name="run", storage_path=str(tmp_path))))
    result = Trainer(_train, scaling_config=ScalingConfig(num_workers=0),
                     run_config=config).fit()
    assert result.metrics == {"loss": 1}
    assert os.path.isdir(result.path)
