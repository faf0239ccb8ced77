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
import sys
from collections.abc import Iterator
from typing import Any

import torch.distributed as dist
import transformers
from torch.utils.data import DataLoader, IterableDataset
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from cairn._src.config.run import CheckpointUploadMode
from cairn._src.config.validation import ValidationTaskConfig
from cairn._src.errors import ConfigError
from cairn._src.integrations.reporting import (
    ReportOptions,
    StagingFolders,
    remove_stale,
    report_staged,
    run_token,
    staging_directory,
    staging_token,
)
from cairn._src.torch.placement import rank_and_world_size
from cairn._src.train.api import get_context
from cairn._src.worker.session import get_session

logger = logging.getLogger(__name__)

# Inside output_dir, which the Trainer's push_to_hub uploads with ignore_patterns=["_*",
# "checkpoint-*"]: a name starting with "_" is never pushed to the Hub.
STAGING_PREFIX = "_cairn-staging-"
# The name earlier versions used: their leftovers are cleared like stale ones.
_OLD_STAGING_PREFIX = ".cairn-staging-"


def _wait_for_every_rank() -> None:
    """The ranks' barrier before staging: torch.distributed's when the process group is up,
    so the wait has the group's timeout (``TorchConfig(timeout_s=...)``), the bound of any
    collective the training does next, and not Cairn's ``collective_timeout_s``: rank 0
    may write a large model to slow storage for longer than that."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    else:
        get_session("CairnReportCallback.on_save").collectives.barrier()


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
    reports its metrics alone. The barrier is ``torch.distributed.barrier()`` (bounded by the
    process group's timeout, not ``FailureConfig.collective_timeout_s``), or Cairn's when
    no process group is initialized.

    Files are hard-linked (copied where the file system refuses links) into a staging
    directory ``<output_dir>/_cairn-staging-<run>-a<attempt>-r<rank>-*``, which the Trainer
    ignores and ``push_to_hub`` does not upload (it skips ``_*``). It is removed once its
    report is done, whatever the outcome: committed, skipped (``upload_failure_policy=
    "skip"``) or failed; ASYNC reports are checked at each step and save, and waited for
    at ``on_train_end``, so ``output_dir`` holds no staging directory once ``train()``
    returns. ``on_train_begin`` removes what an earlier attempt (or run) left there.

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
        self._staging = StagingFolders()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # Every rank, before any save (each save starts with a barrier): what a killed
        # attempt of this run left, its own rank's and any other's, but no folder of this
        # attempt, nor another run's (one sharing output_dir may upload from it now).
        current = f"{STAGING_PREFIX}{staging_token()}-"
        remove_stale(args.output_dir, f"{STAGING_PREFIX}{run_token()}-", current)
        remove_stale(args.output_dir, _OLD_STAGING_PREFIX, current)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._staging.sweep()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._staging.drain()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        metrics: dict[str, Any] = {}
        for entry in state.log_history:
            metrics.update(entry)
        source = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        if get_context().get_world_size() > 1:
            # The Trainer saves without a barrier after it: rank 0 may still be writing
            # the model while rank 1 is already here.
            _wait_for_every_rank()
        self._staging.sweep()
        # Inside output_dir: on the checkpoint's own file system, so the files can be linked.
        # The Trainer ignores it (its checkpoint folders are named checkpoint-<step>).
        rank = get_context().get_world_rank()
        staging = staging_directory(f"{STAGING_PREFIX}{staging_token()}-r{rank}-",
                                    parent=args.output_dir)
        try:
            if os.path.isdir(source):
                _stage(source, staging, self.CHECKPOINT_NAME)
            else:
                logger.debug("Step %d: %s does not exist on this rank; reporting metrics only",
                             state.global_step, source)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        report_staged(metrics, staging, self._options, self._staging)


RayTrainReportCallback = CairnReportCallback


def _is_ray_data_iterable(data: object) -> bool:
    """Whether ``data`` is what ``DataIterator.iter_torch_batches()`` (or ``iter_batches()``)
    returns: an iterable of ready batches, with no ``__len__``, that is no torch dataset."""
    iterator = sys.modules.get("ray.data.iterator")  # not imported: not a Ray Data iterable
    kind = getattr(iterator, "_IterableFromIterator", None)
    return kind is not None and isinstance(data, kind)


class _BatchIterable(IterableDataset[Any]):
    """A Ray Data iterable of batches as a torch ``IterableDataset``: each item is a batch."""

    def __init__(self, batches: Any) -> None:
        super().__init__()
        self.batches = batches

    def __iter__(self) -> Iterator[Any]:
        return iter(self.batches)


def _first(items: list[Any]) -> Any:
    return items[0]


def _batch_loader(batches: Any) -> DataLoader[Any]:
    # The iterable yields whole batches (already this rank's shard): one per step, as is.
    return DataLoader(_BatchIterable(batches), batch_size=1, collate_fn=_first)


def _prepared_class(base: type[Any]) -> type[Any]:
    """``base`` with data loaders that take Ray Data iterables, as Ray's prepare_trainer
    makes (``base`` itself when it is one already)."""
    if getattr(base, "_cairn_ray_data", False):
        return base

    def get_train_dataloader(self: Any) -> Any:
        if _is_ray_data_iterable(self.train_dataset):
            return _batch_loader(self.train_dataset)
        return base.get_train_dataloader(self)

    def get_eval_dataloader(self: Any, eval_dataset: Any = None) -> Any:
        chosen = self.eval_dataset if eval_dataset is None else eval_dataset
        if isinstance(chosen, str) and isinstance(self.eval_dataset, dict):
            chosen = self.eval_dataset.get(chosen)
        if _is_ray_data_iterable(chosen):
            return _batch_loader(chosen)
        return base.get_eval_dataloader(self, eval_dataset)

    def train(self: Any, *args: Any, **kwargs: Any) -> Any:
        # Checked when training starts: a callback may be added after prepare_trainer.
        if not any(isinstance(callback, CairnReportCallback)
                   for callback in self.callback_handler.callbacks):
            logger.warning(
                "The Trainer has no cairn.huggingface.CairnReportCallback, so it reports "
                "nothing to Cairn and a restart starts from scratch; pass "
                "callbacks=[CairnReportCallback()] or call trainer.add_callback(...) before "
                "trainer.train().")
        return base.train(self, *args, **kwargs)

    return type(base.__name__, (base,), {
        "__module__": base.__module__,
        "__qualname__": base.__qualname__,
        "__doc__": base.__doc__,
        "_cairn_ray_data": True,
        "get_train_dataloader": get_train_dataloader,
        "get_eval_dataloader": get_eval_dataloader,
        "train": train,
    })


def prepare_trainer(trainer: Any) -> Any:
    """Prepares a ``transformers.Trainer`` for a Cairn run and returns it, as Ray's
    ``prepare_trainer`` does: the same object, whose class becomes a subclass of its own
    that feeds Ray Data to the Trainer.

    A ``train_dataset`` or ``eval_dataset`` (or an entry of a dict of eval datasets) that is
    a Ray Data iterable, what ``cairn.get_dataset_shard("train").iter_torch_batches(...)``
    returns, is read batch by batch as this rank's shard (``DataLoader(batch_size=1)`` of
    the ready batches, as in Ray; set ``max_steps``, since the iterable has no length). A
    torch ``Dataset`` goes to the Trainer's own data loader, which shards it over the ranks
    of the process group :class:`cairn.torch.TorchTrainer` initialized. Beyond Ray:

    * refuses anything but a ``transformers.Trainer``, and, with more than one worker, a
      worker where ``torch.distributed`` is not initialized (the function must run under
      :class:`cairn.torch.TorchTrainer`: without a process group every rank would train
      alone), with a :class:`cairn.ConfigError`;
    * warns when ``save_strategy`` is ``"no"``, or when no :class:`CairnReportCallback` is
      among the Trainer's callbacks as ``train()`` starts (it may be added after this
      call): nothing would be checkpointed, and a restart would start from scratch.
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
    if str(getattr(trainer.args.save_strategy, "value", trainer.args.save_strategy)) == "no":
        logger.warning(
            "prepare_trainer: TrainingArguments(save_strategy='no') saves no checkpoint, so "
            "CairnReportCallback reports nothing; use 'steps' or 'epoch'."
        )
    trainer.__class__ = _prepared_class(type(trainer))
    return trainer
