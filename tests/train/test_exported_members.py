"""The front door: what ``import cairn`` offers, pinned."""

from __future__ import annotations

import cairn


def test_exported_members() -> None:
    # Sorted as ruff (RUF022) sorts it: constants, classes, then functions.
    assert cairn.__all__ == sorted(cairn.__all__, key=lambda n: (
        0 if n.isupper() else 1 if n[0].isupper() else 2, n))
    assert cairn.__all__ == [
        "TRAIN_DATASET_KEY",
        "AttemptStopped", "CairnError", "Callback", "Checkpoint", "CheckpointCollisionError",
        "CheckpointConfig",
        "CheckpointConsistencyMode", "CheckpointNotFoundError", "CheckpointUploadMode",
        "ChecksumMismatchError", "CollectiveTimeoutError", "ConfigDeprecationError", "ConfigError",
        "ControllerError", "DataConfig", "FailureConfig", "GoodputSummary", "ManifestError",
        "MetadataTypeError", "OutsideWorkerError", "PlacementTimeoutError", "PreemptionError",
        "PreemptionInfo", "ReportError",
        "ReportHandle", "ReportedCheckpoint",
        "ReportedCheckpointStatus", "Result", "RetryPolicy", "RunConfig", "RunFailedError",
        "RunLeaseError", "RunNotFoundError", "ScalingConfig", "StorageError",
        "TrainContext", "Trainer", "TrainingFailedError", "TransferConfig", "UnknownSchemeError",
        "UnsafePathError",
        "UserCallback", "ValidationConfig", "ValidationFn", "ValidationTaskConfig",
        "WorkerGroupError", "WorkerProcessError", "get_all_reported_checkpoints", "get_checkpoint",
        "get_context", "get_dataset_shard", "get_preemption_info", "report",
    ]
    for name in cairn.__all__:
        value = getattr(cairn, name)
        if isinstance(value, str):  # a constant: Ray Train's value
            assert name == "TRAIN_DATASET_KEY" and value == "train"
            continue
        assert value.__module__.startswith("cairn")


def test_errors_share_one_root_and_builtins() -> None:
    for name in cairn.__all__:
        value = getattr(cairn, name)
        if isinstance(value, type) and issubclass(value, Exception):
            assert issubclass(value, cairn.CairnError)
    assert issubclass(cairn.CheckpointNotFoundError, FileNotFoundError)
    assert issubclass(cairn.ConfigError, ValueError)
    assert issubclass(cairn.CollectiveTimeoutError, TimeoutError)
    assert issubclass(cairn.PlacementTimeoutError, TimeoutError)
    # A stop, like KeyboardInterrupt: `except Exception` in a train loop lets it through.
    assert issubclass(cairn.AttemptStopped, BaseException)
    assert not issubclass(cairn.AttemptStopped, Exception)
    # As Ray Train raises them: code written for Ray catches Cairn's errors.
    assert issubclass(cairn.WorkerGroupError, cairn.TrainingFailedError)
    assert issubclass(cairn.ControllerError, cairn.TrainingFailedError)
    assert issubclass(cairn.PreemptionError, cairn.TrainingFailedError)
    assert not issubclass(cairn.PreemptionError, cairn.WorkerGroupError)
    assert issubclass(cairn.ConfigDeprecationError, DeprecationWarning)
    assert issubclass(cairn.RunNotFoundError, RuntimeError)
    assert issubclass(cairn.RunNotFoundError, FileNotFoundError)
    assert issubclass(cairn.OutsideWorkerError, RuntimeError)
    assert issubclass(cairn.OutsideWorkerError, cairn.ReportError)
    assert issubclass(cairn.MetadataTypeError, TypeError)
    assert issubclass(cairn.MetadataTypeError, cairn.ConfigError)
