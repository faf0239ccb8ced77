"""The demo's resume line names the epoch that the checkpoint's metrics (and the demo's
list of kept checkpoints) name."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo.py"


def test_the_resume_line_names_the_checkpointed_epoch() -> None:
    pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location("cairn_demo", DEMO)
    assert spec is not None and spec.loader is not None
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    # The snapshot reported with the metrics of epoch 19 resumes the loader at epoch 20.
    line = demo.resume_line(1, "checkpoint_000110", 20, 440)
    assert line == ("attempt 1: resumed from checkpoint_000110 (after epoch 19, step 440; "
                    "continuing with epoch 20)")
    assert demo.format_metrics({"epoch": 19, "step": 440}) == "epoch 19  step 440"
