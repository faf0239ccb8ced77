"""A Ray Train script ported by changing imports only runs and fills the same Result fields."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "ray_port"


def load_port() -> object:
    spec = importlib.util.spec_from_file_location("ray_port", EXAMPLE / "port.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script(path: Path, storage: Path) -> dict[str, object]:
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                          env={**os.environ, "STORAGE_PATH": str(storage),
                               # Its own Ray instance, whatever other cluster runs here.
                               "RAY_ADDRESS": "local"}, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_only_import_lines_change() -> None:
    source = (EXAMPLE / "train_ray.py").read_text()
    ported = load_port().port(source)  # type: ignore[attr-defined]
    changed = [(a, b) for a, b in zip(source.splitlines(), ported.splitlines(), strict=True)
               if a != b]
    assert [a for a, _ in changed] == [
        "from ray import train",
        "from ray.train import Checkpoint, CheckpointConfig, RunConfig, ScalingConfig",
        "from ray.train.torch import TorchTrainer, prepare_data_loader, prepare_model",
    ]


def test_ported_script_fills_the_result(tmp_path: Path) -> None:
    ported = tmp_path / "train_cairn.py"
    ported.write_text(load_port().port((EXAMPLE / "train_ray.py").read_text()))  # type: ignore[attr-defined]
    result = run_script(ported, tmp_path / "storage")
    assert result["metrics"]["epoch"] == 3  # type: ignore[index]
    assert result["checkpoint"] == "checkpoint_000004"
    assert result["dataframe_epochs"] == [0, 1, 2, 3]
    # The best two by loss, plus the latest when it is not among them.
    assert len(result["best_checkpoints"]) in (2, 3)  # type: ignore[arg-type]
    assert result["path"] == str(tmp_path / "storage" / "port")
    assert result["error"] is None


@pytest.mark.slow
def test_ray_and_cairn_fill_the_same_fields(tmp_path: Path) -> None:
    pytest.importorskip("ray.train")
    ray_result = run_script(EXAMPLE / "train_ray.py", tmp_path / "ray")
    ported = tmp_path / "train_cairn.py"
    ported.write_text(load_port().port((EXAMPLE / "train_ray.py").read_text()))  # type: ignore[attr-defined]
    cairn_result = run_script(ported, tmp_path / "cairn")
    assert set(ray_result) == set(cairn_result)
    assert ray_result["error"] == cairn_result["error"]
    # Ray's metrics_dataframe holds the reports of the checkpoints it kept; Cairn's holds
    # every report (contract item 2), so Ray's rows are a subset of Cairn's.
    assert set(ray_result["dataframe_epochs"]) <= set(cairn_result["dataframe_epochs"])  # type: ignore[arg-type]
    assert ray_result["metrics"]["epoch"] == cairn_result["metrics"]["epoch"]  # type: ignore[index]
    for result in (ray_result, cairn_result):
        assert 2 <= len(result["best_checkpoints"]) <= 3  # type: ignore[arg-type]
