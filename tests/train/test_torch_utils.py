"""cairn.torch.get_device(), get_devices() and enable_reproducibility() in real workers
(CPU only here; the CUDA paths need a GPU)."""

from __future__ import annotations

from pathlib import Path

import api_workloads

from cairn import RunConfig, ScalingConfig
from cairn.torch import TorchTrainer


def _fit(tmp_path: Path, name: str, seed: int) -> dict[str, object]:
    result = TorchTrainer(
        api_workloads.torch_devices_and_seeds,
        train_loop_config={"seed": seed},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name=name, storage_path=str(tmp_path)),
    ).fit()
    value: dict[str, object] = result.return_value
    return value


def test_devices_and_reproducibility_in_cpu_workers(tmp_path: Path) -> None:
    first = _fit(tmp_path, "a", seed=7)
    assert first["device"] == "cpu" and first["devices"] == ["cpu"]
    assert first["deterministic"] is True and first["cublas"] == ":4096:8"
    # The same seed gives the same draws in a fresh worker; another seed does not.
    assert _fit(tmp_path, "b", seed=7)["draws"] == first["draws"]
    assert _fit(tmp_path, "c", seed=8)["draws"] != first["draws"]
