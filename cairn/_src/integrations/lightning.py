"""Lightning: a callback that reports a Lightning checkpoint at every train epoch end, the
strategies and cluster environment that run Lightning inside a Cairn worker group, and
``prepare_trainer``, with the names of ``ray.train.lightning``.

Layout of a reported checkpoint, as in Ray Train::

    checkpoint_000003/          the Cairn checkpoint (report 3)
    └─ checkpoint.ckpt          ``trainer.save_checkpoint(...)``: weights, optimizer,
                                loops (epoch, step), callbacks' state

so ``trainer.fit(model, ckpt_path=os.path.join(d, CairnReportCallback.CHECKPOINT_NAME))``
resumes from it at the next epoch.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from typing import Any

import torch
import torch.distributed as dist

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
from cairn._src.torch.placement import get_device, rank_and_world_size
from cairn._src.train.api import get_context

logger = logging.getLogger(__name__)

STAGING_PREFIX = "cairn-lightning-"


def _import_lightning() -> tuple[Any, Any]:
    """``lightning.pytorch`` and its ``plugins.environments``, or ``pytorch_lightning``'s."""
    try:
        import lightning.pytorch as module
        import lightning.pytorch.plugins.environments as environments
    except ModuleNotFoundError:  # the standalone distribution, pytorch_lightning
        import pytorch_lightning as module  # type: ignore[no-redef]
        import pytorch_lightning.plugins.environments as environments  # type: ignore[no-redef]
    return module, environments


pl, _environments = _import_lightning()
# Typed as Any: the classes come from whichever distribution is installed.
_DDPStrategy: Any = pl.strategies.DDPStrategy
_FSDPStrategy: Any = pl.strategies.FSDPStrategy
_DeepSpeedStrategy: Any = pl.strategies.DeepSpeedStrategy
_LightningEnvironment: Any = _environments.LightningEnvironment
_Callback: Any = pl.callbacks.Callback


def _sampler_kwargs(strategy: Any) -> dict[str, Any]:
    return {"num_replicas": strategy.world_size, "rank": strategy.global_rank}


class CairnDDPStrategy(_DDPStrategy):  # type: ignore[misc]
    """Lightning's ``DDPStrategy`` on the process group :class:`cairn.torch.TorchTrainer`
    already initialized: the device is :func:`cairn.torch.get_device`, the data is sharded
    over the run's world size and rank.

    Takes every argument of ``DDPStrategy``; the process group's backend and timeout come
    from :class:`cairn.torch.TorchConfig`, since the group exists before Lightning starts.
    """

    @property
    def root_device(self) -> torch.device:
        return get_device()

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        return _sampler_kwargs(self)


class CairnFSDPStrategy(_FSDPStrategy):  # type: ignore[misc]
    """Lightning's ``FSDPStrategy`` inside a Cairn worker group (see
    :class:`CairnDDPStrategy`)."""

    @property
    def root_device(self) -> torch.device:
        return get_device()

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        return _sampler_kwargs(self)


class CairnDeepSpeedStrategy(_DeepSpeedStrategy):  # type: ignore[misc]
    """Lightning's ``DeepSpeedStrategy`` inside a Cairn worker group (see
    :class:`CairnDDPStrategy`); needs ``deepspeed`` installed, which Cairn does not test."""

    @property
    def root_device(self) -> torch.device:
        return get_device()

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        return _sampler_kwargs(self)


class CairnLightningEnvironment(_LightningEnvironment):  # type: ignore[misc]
    """A Lightning ``ClusterEnvironment`` whose world size and ranks are the Cairn worker's
    (:func:`cairn.get_context`); Lightning's attempts to set them are ignored, and its
    teardown leaves the worker's environment alone. The rendezvous address is the one
    :class:`cairn.torch.TorchTrainer` exports (``MASTER_ADDR``, ``MASTER_PORT``)."""

    def world_size(self) -> int:
        return get_context().get_world_size()

    def global_rank(self) -> int:
        return get_context().get_world_rank()

    def local_rank(self) -> int:
        return get_context().get_local_rank()

    def node_rank(self) -> int:
        return get_context().get_node_rank()

    def set_world_size(self, size: int) -> None:
        pass

    def set_global_rank(self, rank: int) -> None:
        # Keeps rank_zero_only (Lightning's rank-zero logging) on the worker's real rank.
        super().set_global_rank(self.global_rank())

    def teardown(self) -> None:
        pass


_STRATEGIES: tuple[type[Any], ...] = (CairnDDPStrategy, CairnFSDPStrategy,
                                      CairnDeepSpeedStrategy)


def prepare_trainer(trainer: Any) -> Any:
    """Checks a Lightning ``Trainer`` for a Cairn worker group and returns it, unchanged.

    As Ray's: the strategy must be :class:`CairnDDPStrategy`, :class:`CairnFSDPStrategy` or
    :class:`CairnDeepSpeedStrategy` (or a subclass; the ``Ray*`` names are the same
    classes), and a cluster environment, when the strategy has one, a
    :class:`CairnLightningEnvironment`. Beyond Ray: with more than one worker,
    ``torch.distributed`` must be initialized (run the function with
    :class:`cairn.torch.TorchTrainer`). Each mistake raises :class:`cairn.ConfigError`
    (Ray raises ``RuntimeError``).
    """
    if not isinstance(trainer, pl.Trainer):
        raise ConfigError(
            f"prepare_trainer(trainer={trainer!r}) must be a Lightning Trainer, not "
            f"{type(trainer).__name__}."
        )
    strategy = trainer.strategy
    if not isinstance(strategy, _STRATEGIES):
        accepted = ", ".join(cls.__name__ for cls in _STRATEGIES)
        raise ConfigError(
            f"prepare_trainer: Trainer(strategy=...) is a {type(strategy).__name__}; a Cairn "
            f"worker group needs one of {accepted} (or a subclass), from cairn.lightning, "
            "e.g. Trainer(strategy=CairnDDPStrategy(), plugins=[CairnLightningEnvironment()])."
        )
    environment = getattr(strategy, "cluster_environment", None)
    if environment is not None and not isinstance(environment, CairnLightningEnvironment):
        raise ConfigError(
            f"prepare_trainer: the strategy's cluster environment is a "
            f"{type(environment).__name__}; it must be a cairn.lightning."
            "CairnLightningEnvironment: pass Trainer(plugins=[CairnLightningEnvironment()])."
        )
    _, world_size = rank_and_world_size()
    if world_size > 1 and not (dist.is_available() and dist.is_initialized()):
        raise ConfigError(
            f"prepare_trainer: this run has {world_size} workers but torch.distributed is not "
            "initialized in them; run the train function with cairn.torch.TorchTrainer, "
            "which sets up the process group Lightning trains on."
        )
    return trainer


def _scalar(name: str, value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ConfigError(
                f"trainer.callback_metrics[{name!r}] is a tensor of shape "
                f"{tuple(value.shape)}; CairnReportCallback reports scalars only."
            )
        return value.item()
    return value


def _attempt_prefix() -> str:
    return f"{STAGING_PREFIX}{staging_token()}-"


def _shared_staging(trainer: Any) -> str:
    """Rank 0's new staging directory, the same path on every rank (created where missing).

    Lightning checkpoints into rank 0's path on every rank (``strategy.broadcast``): with
    sharded state (FSDP ``state_dict_type="sharded"``, DeepSpeed) each rank writes its
    shards there, on its own machine, so each rank must report that path to put every
    machine's shards into the checkpoint."""
    staging: str | None = None
    if trainer.global_rank == 0:
        staging = staging_directory(f"{_attempt_prefix()}e{trainer.current_epoch}-")
    staging = trainer.strategy.broadcast(staging, 0)
    assert staging is not None
    os.makedirs(staging, exist_ok=True)
    return staging


class CairnReportCallback(_Callback):  # type: ignore[misc]
    """Reports ``trainer.callback_metrics`` and a Lightning checkpoint at every train epoch
    end, as Ray Train's ``ray.train.lightning.RayTrainReportCallback``.

    Rank 0 makes a fresh local directory and broadcasts its path (as Lightning broadcasts
    rank 0's checkpoint path), every rank creates that path on its own machine and calls
    ``trainer.save_checkpoint`` into it, and every rank reports that directory once: the
    metrics as Python numbers, plus ``epoch`` (``trainer.current_epoch``) and ``step``
    (``trainer.global_step``). What each rank finds there is what Lightning wrote on its
    machine: the file ``checkpoint.ckpt`` (:attr:`CHECKPOINT_NAME`) written by rank 0
    alone with DDP or FSDP's default full state dict, or each rank's shards in the folder
    ``checkpoint.ckpt`` with ``FSDPStrategy(state_dict_type="sharded")`` or DeepSpeed.
    Ranks on one machine report the same directory (its files are stored once); a rank
    whose directory holds nothing reports its metrics alone.

    ``checkpoint_upload_mode`` (``"SYNC"``, the default, or ``"ASYNC"``) and
    ``validation`` are passed to :func:`cairn.report`. The local directory is removed once
    its report is done, whatever the outcome (committed, skipped or failed); ASYNC reports
    are checked at each epoch end and waited for at ``on_train_end``. ``on_train_start``
    removes what an earlier attempt of the run left in the temporary directory.
    """

    CHECKPOINT_NAME = "checkpoint.ckpt"

    def __init__(
        self,
        checkpoint_upload_mode: CheckpointUploadMode | str | None = None,
        validation: bool | ValidationTaskConfig = False,
    ) -> None:
        super().__init__()
        self._options = ReportOptions.parse(
            type(self).__name__, checkpoint_upload_mode, validation)
        self.checkpoint_upload_mode = self._options.checkpoint_upload_mode
        self.validation = self._options.validation
        self._staging = StagingFolders()

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        # This run's folders of other attempts (not another run's: the temporary directory
        # may be shared); never this attempt's, whichever rank named them.
        remove_stale(tempfile.gettempdir(), f"{STAGING_PREFIX}{run_token()}-",
                     _attempt_prefix())

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._staging.drain()

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        metrics = {name: _scalar(name, value)
                   for name, value in trainer.callback_metrics.items()}
        metrics["epoch"] = trainer.current_epoch
        metrics["step"] = trainer.global_step
        self._staging.sweep()
        staging = _shared_staging(trainer)
        try:
            trainer.save_checkpoint(os.path.join(staging, self.CHECKPOINT_NAME),
                                    weights_only=False)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        report_staged(metrics, staging, self._options, self._staging)


RayTrainReportCallback = CairnReportCallback
RayDDPStrategy = CairnDDPStrategy
RayFSDPStrategy = CairnFSDPStrategy
RayDeepSpeedStrategy = CairnDeepSpeedStrategy
RayLightningEnvironment = CairnLightningEnvironment
