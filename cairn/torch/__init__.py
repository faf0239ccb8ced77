"""PyTorch for Cairn: ``TorchTrainer``, data-parallel helpers, the whole training state in
a checkpoint, and in-memory snapshots that upload in the background.

The names follow ``ray.train.torch`` (``TorchTrainer``, ``TorchConfig``,
``prepare_model``, ``prepare_data_loader``, ``get_device``, ``get_devices``,
``enable_reproducibility``); see docs/torch.md.
"""

from __future__ import annotations

try:
    import torch as _torch  # noqa: F401
except ImportError as _missing:
    raise ImportError("cairn.torch needs PyTorch: pip install 'cairn-train[torch]'") from _missing

from typing import TYPE_CHECKING, Any

from cairn._src.torch.config import TorchConfig
from cairn._src.torch.data_loader import PreparedDataLoader, prepare_data_loader
from cairn._src.torch.model import prepare_model
from cairn._src.torch.placement import get_device, get_devices
from cairn._src.torch.reproducibility import enable_reproducibility
from cairn._src.torch.snapshot import report_snapshot
from cairn._src.torch.trainer import TorchTrainer
from cairn._src.torch.training_state import (
    TrainingState,
    load_training_state,
    save_training_state,
)

if TYPE_CHECKING:
    from cairn._src.torch.dcp_writer import FileSystemWriter


def __getattr__(name: str) -> Any:
    # FileSystemWriter is imported on first use: torch.distributed.checkpoint, which it
    # extends, takes about half a second to import, on the path of every worker's start.
    if name == "FileSystemWriter":
        from cairn._src.torch.dcp_writer import FileSystemWriter

        return FileSystemWriter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "FileSystemWriter",
    "PreparedDataLoader",
    "TorchConfig",
    "TorchTrainer",
    "TrainingState",
    "enable_reproducibility",
    "get_device",
    "get_devices",
    "load_training_state",
    "prepare_data_loader",
    "prepare_model",
    "report_snapshot",
    "save_training_state",
]
