"""The functions a training function calls: ``report``, ``get_checkpoint``, ``get_context``.

Thin: they find the worker's session and hand off to it. Called outside a worker they
raise :class:`OutsideWorkerError` (a :class:`ReportError` and a ``RuntimeError``) saying
where to call them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cairn._src.checkpoint.checkpoint import Checkpoint
from cairn._src.config.run import CheckpointUploadMode
from cairn._src.config.validation import ValidationTaskConfig
from cairn._src.worker.context import TrainContext
from cairn._src.worker.report_handle import ReportHandle
from cairn._src.worker.session import get_session


def report(
    metrics: dict[str, Any],
    checkpoint: Checkpoint | None = None,
    *,
    checkpoint_dir_name: str | None = None,
    checkpoint_upload_mode: CheckpointUploadMode | str = CheckpointUploadMode.SYNC,
    delete_local_checkpoint_after_upload: bool | None = None,
    checkpoint_upload_fn: Callable[[Checkpoint, str], Checkpoint] | None = None,
    validation: bool | ValidationTaskConfig = False,
) -> ReportHandle:
    """Report metrics, and optionally a checkpoint, from every rank.

    The n-th call of every rank is report n. Metric-only reports return at once. With a
    checkpoint: ``SYNC`` returns once it is committed; ``ASYNC`` returns a handle at once
    (``handle.wait()`` for the commit; ``report()`` waits only when
    ``CheckpointConfig.max_pending_uploads`` uploads are already pending); ``NO_UPLOAD``
    registers a checkpoint already on storage, by reference. Ranks' checkpoints of one
    report merge into one directory; ``checkpoint_upload_fn(checkpoint, dir_name)``
    replaces the built-in upload and returns the uploaded :class:`Checkpoint`.
    ``delete_local_checkpoint_after_upload`` defaults to True for ASYNC, False otherwise.
    ``validation=True`` (or a :class:`ValidationTaskConfig`) validates the checkpoint with
    the trainer's ``validation_config``, off the train loop.
    """
    return get_session("report").report(
        metrics,
        checkpoint,
        checkpoint_dir_name=checkpoint_dir_name,
        checkpoint_upload_mode=checkpoint_upload_mode,
        delete_local_checkpoint_after_upload=delete_local_checkpoint_after_upload,
        checkpoint_upload_fn=checkpoint_upload_fn,
        validation=validation,
    )


def get_checkpoint() -> Checkpoint | None:
    """The latest committed checkpoint: at the start of an attempt, the one it resumes from.

    Every rank gets the same answer at the start of an attempt and after a SYNC checkpoint
    report returns. None when the run has no committed checkpoint yet.
    """
    return get_session("get_checkpoint").get_checkpoint()


def get_dataset_shard(dataset_name: str | None = None) -> Any:
    """This worker's shard of ``Trainer(datasets={dataset_name: ...})``, as in Ray Train:
    a ``ray.data.DataIterator`` (``iter_batches()``, ``iter_torch_batches()``).

    The datasets are split anew at each start of the worker group, one shard per worker
    of that attempt. ``dataset_name`` may be left out when there is one dataset; a name
    the trainer does not have raises :class:`ConfigError` naming the ones it has.
    """
    return get_session("get_dataset_shard").datasets.get(dataset_name)


def get_context() -> TrainContext:
    """This worker's rank, world size, run name, attempt number and storage."""
    return get_session("get_context").context
