"""Cairn: fault-tolerant training with checkpoints committed, verified and resumed on any
storage. The public API follows Ray Train 2.x; see the README for the contract."""

from __future__ import annotations

import importlib

from cairn._src.checkpoint.checkpoint import Checkpoint
from cairn._src.checkpoint.reported import (
    CheckpointConsistencyMode,
    ReportedCheckpoint,
    ReportedCheckpointStatus,
)
from cairn._src.config.data import DataConfig
from cairn._src.config.failure import FailureConfig
from cairn._src.config.run import (
    CheckpointConfig,
    CheckpointUploadMode,
    RunConfig,
    ScalingConfig,
)
from cairn._src.config.validation import ValidationConfig, ValidationFn, ValidationTaskConfig
from cairn._src.errors import (
    AttemptStopped,
    CairnError,
    CheckpointCollisionError,
    CheckpointNotFoundError,
    ChecksumMismatchError,
    CollectiveTimeoutError,
    ConfigDeprecationError,
    ConfigError,
    ControllerError,
    ManifestError,
    MetadataTypeError,
    OutsideWorkerError,
    PlacementTimeoutError,
    PreemptionError,
    ReportError,
    RunFailedError,
    RunLeaseError,
    RunNotFoundError,
    StorageError,
    TrainingFailedError,
    UnknownSchemeError,
    UnsafePathError,
    WorkerGroupError,
    WorkerProcessError,
)
from cairn._src.goodput.summary import GoodputSummary
from cairn._src.observe.callbacks import Callback, UserCallback
from cairn._src.storage.retry import RetryPolicy
from cairn._src.storage.tuning import TransferConfig
from cairn._src.train.api import get_checkpoint, get_context, get_dataset_shard, report
from cairn._src.train.preemption_api import get_preemption_info
from cairn._src.train.reported_api import get_all_reported_checkpoints
from cairn._src.train.result import Result
from cairn._src.train.trainer import Trainer
from cairn._src.version import __version__ as __version__
from cairn._src.wire.preemption import PreemptionInfo
from cairn._src.worker.context import TrainContext
from cairn._src.worker.report_handle import ReportHandle

# Ray Train scripts do `import ray.train.torch` once and call `ray.train.torch.X` inside the
# train function, which runs in worker processes that never imported the submodule: load the
# submodules on first attribute access, as `import cairn.torch` would.
_SUBMODULES = frozenset({"collective", "huggingface", "lightning", "storage", "torch"})

# The name of the dataset that ``ray.train`` scripts pass as ``datasets={TRAIN_DATASET_KEY:
# ...}`` and read back with ``get_dataset_shard(TRAIN_DATASET_KEY)``: Ray Train's value.
TRAIN_DATASET_KEY = "train"


def __getattr__(name: str) -> object:
    if name in _SUBMODULES:
        return importlib.import_module(f"cairn.{name}")
    raise AttributeError(f"module 'cairn' has no attribute {name!r}")



__all__ = [
    "TRAIN_DATASET_KEY",
    "AttemptStopped",
    "CairnError",
    "Callback",
    "Checkpoint",
    "CheckpointCollisionError",
    "CheckpointConfig",
    "CheckpointConsistencyMode",
    "CheckpointNotFoundError",
    "CheckpointUploadMode",
    "ChecksumMismatchError",
    "CollectiveTimeoutError",
    "ConfigDeprecationError",
    "ConfigError",
    "ControllerError",
    "DataConfig",
    "FailureConfig",
    "GoodputSummary",
    "ManifestError",
    "MetadataTypeError",
    "OutsideWorkerError",
    "PlacementTimeoutError",
    "PreemptionError",
    "PreemptionInfo",
    "ReportError",
    "ReportHandle",
    "ReportedCheckpoint",
    "ReportedCheckpointStatus",
    "Result",
    "RetryPolicy",
    "RunConfig",
    "RunFailedError",
    "RunLeaseError",
    "RunNotFoundError",
    "ScalingConfig",
    "StorageError",
    "TrainContext",
    "Trainer",
    "TrainingFailedError",
    "TransferConfig",
    "UnknownSchemeError",
    "UnsafePathError",
    "UserCallback",
    "ValidationConfig",
    "ValidationFn",
    "ValidationTaskConfig",
    "WorkerGroupError",
    "WorkerProcessError",
    "get_all_reported_checkpoints",
    "get_checkpoint",
    "get_context",
    "get_dataset_shard",
    "get_preemption_info",
    "report",
]
