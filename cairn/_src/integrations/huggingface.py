"""Hugging Face Transformers: a ``TrainerCallback`` that reports each checkpoint the
``transformers.Trainer`` saves, and ``prepare_trainer``, as ``ray.train.huggingface.transformers``.

Layout of a reported checkpoint, as in Ray Train::

    checkpoint_000003/          the Cairn checkpoint (report 3)
    └─ checkpoint/              the Trainer's ``checkpoint-<step>`` folder: model,
                                optimizer, scheduler, trainer_state.json, rng_state*.pth

so ``trainer.train(resume_from_checkpoint=os.path.join(d, CairnReportCallback.CHECKPOINT_NAME))``
resumes from it.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
from typing import Any

import torch.distributed as dist
import transformers
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from cairn._src.config.run import CheckpointUploadMode
from cairn._src.config.validation import ValidationTaskConfig
from cairn._src.errors import ConfigError
from cairn._src.integrations.reporting import ReportOptions, report_staged, staging_directory
from cairn._src.torch.placement import rank_and_world_size
from cairn._src.train.api import get_context
from cairn._src.worker.session import get_session

logger = logging.getLogger(__name__)

STAGING_PREFIX = ".cairn-staging-"


def _link_or_copy(source: str, destination: str) -> None:
    # A hard link costs no data copy, and keeps the file's content even when the Trainer
    # rotates the source folder away (save_total_limit) before an ASYNC upload read it.
    try:
        os.link(source, destination)
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise
        shutil.copy2(source, destination)


def _stage(source: str, staging: str, name: str) -> None:
    shutil.copytree(source, os.path.join(staging, name), copy_function=_link_or_copy)


class CairnReportCallback(transformers.TrainerCallback):
    """Reports each checkpoint the ``transformers.Trainer`` saves, with the metrics logged
    so far, through :func:`cairn.report`, as Ray Train's ``RayTrainReportCallback``.

    At every ``on_save`` (and only then: logs and evaluations between saves are not
    reported) every rank reports once:

    * metrics: every entry of ``state.log_history`` merged, later values winning (so the
      last ``loss``, ``learning_rate``, ``epoch``, ``step`` and any ``eval_*``), as Ray does;
    * checkpoint: the folder ``<output_dir>/checkpoint-<global_step>`` the Trainer just
      wrote, under ``checkpoint/`` (:attr:`CHECKPOINT_NAME`) in the reported checkpoint.

    Unlike Ray, each rank waits for the others (``cairn.collective.barrier()``) before it
    stages the folder, so on a shared ``output_dir`` no rank reads a file another rank is
    still writing, and every rank contributes the files it sees: rank 0's model, optimizer
    and trainer state and each rank's own ``rng_state_<rank>.pth`` merge into one
    checkpoint (identical files are stored once). A rank whose folder does not exist
    reports its metrics alone. Files are hard-linked (copied where the file system refuses
    links) into a staging directory ``<output_dir>/.cairn-staging-*``, removed once the
    checkpoint is committed (after its upload, with ASYNC).

    ``checkpoint_upload_mode`` (``"SYNC"``, the default, or ``"ASYNC"``) and
    ``validation`` are passed to :func:`cairn.report`, as Ray's Lightning callback does.
    Make ``logging_steps`` divide ``save_steps`` (or use the same strategy) so that the
    metrics of a checkpoint are current, as Ray's documentation advises.
    """

    CHECKPOINT_NAME = "checkpoint"

    def __init__(
        self,
        *,
        checkpoint_upload_mode: CheckpointUploadMode | str | None = None,
        validation: bool | ValidationTaskConfig = False,
    ) -> None:
        super().__init__()
        self._options = ReportOptions.parse(
            type(self).__name__, checkpoint_upload_mode, validation)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        metrics: dict[str, Any] = {}
        for entry in state.log_history:
            metrics.update(entry)
        source = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        if get_context().get_world_size() > 1:
            # The Trainer saves without a barrier after it: rank 0 may still be writing
            # the model while rank 1 is already here.
            get_session("CairnReportCallback.on_save").collectives.barrier()
        # Inside output_dir: on the checkpoint's own file system, so the files can be linked.
        # The Trainer ignores it (its checkpoint folders are named checkpoint-<step>).
        staging = staging_directory(STAGING_PREFIX, parent=args.output_dir)
        try:
            if os.path.isdir(source):
                _stage(source, staging, self.CHECKPOINT_NAME)
            else:
                logger.debug("Step %d: %s does not exist on this rank; reporting metrics only",
                             state.global_step, source)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        report_staged(metrics, staging, self._options)


RayTrainReportCallback = CairnReportCallback


def prepare_trainer(trainer: Any) -> Any:
    """Checks a ``transformers.Trainer`` for a Cairn run and returns it, unchanged.

    Ray's ``prepare_trainer`` swaps the Trainer's data loaders for Ray Data iterables; Cairn
    has no Ray Data, and a torch ``Dataset`` needs nothing: in a
    :class:`cairn.torch.TorchTrainer` worker, ``torch.distributed`` is initialized and the
    Trainer shards the data over the ranks itself. What this does:

    * refuses anything but a ``transformers.Trainer``, and, with more than one worker, a
      worker where ``torch.distributed`` is not initialized (the function must run under
      :class:`cairn.torch.TorchTrainer`: without a process group every rank would train
      alone), with a :class:`cairn.ConfigError`;
    * warns when no :class:`CairnReportCallback` is among the Trainer's callbacks, or when
      ``save_strategy`` is ``"no"``: nothing would be checkpointed, and a restart would
      start from scratch.
    """
    if not isinstance(trainer, transformers.Trainer):
        raise ConfigError(
            f"prepare_trainer(trainer={trainer!r}) must be a transformers.Trainer, not "
            f"{type(trainer).__name__}."
        )
    _, world_size = rank_and_world_size()
    if world_size > 1 and not (dist.is_available() and dist.is_initialized()):
        raise ConfigError(
            f"prepare_trainer: this run has {world_size} workers but torch.distributed is not "
            "initialized in them, so each would train alone; run the train function with "
            "cairn.torch.TorchTrainer, which sets up the process group the Trainer uses."
        )
    callbacks = trainer.callback_handler.callbacks
    if not any(isinstance(callback, CairnReportCallback) for callback in callbacks):
        logger.warning(
            "prepare_trainer: the Trainer has no cairn.huggingface.CairnReportCallback, so "
            "it reports nothing to Cairn and a restart starts from scratch; pass "
            "callbacks=[CairnReportCallback()] or call trainer.add_callback(...)."
        )
    if str(getattr(trainer.args.save_strategy, "value", trainer.args.save_strategy)) == "no":
        logger.warning(
            "prepare_trainer: TrainingArguments(save_strategy='no') saves no checkpoint, so "
            "CairnReportCallback reports nothing; use 'steps' or 'epoch'."
        )
    return trainer
