"""``prepare_model``: a model on this worker's device, wrapped for data parallelism."""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from cairn._src.errors import ConfigError
from cairn._src.torch.placement import get_device, rank_and_world_size

logger = logging.getLogger(__name__)

PARALLEL_STRATEGIES = ("ddp", None)


def prepare_model(
    model: nn.Module,
    move_to_device: bool | torch.device = True,
    parallel_strategy: str | None = "ddp",
    parallel_strategy_kwargs: dict[str, Any] | None = None,
) -> nn.Module:
    """``model`` moved to :func:`get_device` and, with more than one worker, wrapped in
    :class:`~torch.nn.parallel.DistributedDataParallel`.

    ``move_to_device`` may also name the device; ``parallel_strategy=None`` skips the
    wrapper; ``parallel_strategy_kwargs`` go to DDP (``find_unused_parameters=...``).
    The arguments may be passed by position, in Ray Train's order.
    DDP makes every rank start from rank 0's parameters. With one worker the model is
    returned unwrapped. Raises :class:`ConfigError` when DDP is asked for with several
    workers but ``torch.distributed`` is not initialized (use ``cairn.torch.TorchTrainer``).
    """
    if not isinstance(model, nn.Module):
        raise ConfigError(f"prepare_model(model={model!r}) must be a torch.nn.Module.")
    if parallel_strategy not in PARALLEL_STRATEGIES:
        hint = (" Cairn has no FSDP wrapper: wrap the model with torch.distributed.fsdp "
                "yourself (TorchTrainer has initialized the process group) and pass "
                "parallel_strategy=None." if parallel_strategy == "fsdp" else "")
        raise ConfigError(
            f"prepare_model(parallel_strategy={parallel_strategy!r}) is not one of 'ddp', "
            f"None.{hint}"
        )
    if parallel_strategy_kwargs is not None and not isinstance(parallel_strategy_kwargs, dict):
        raise ConfigError(
            f"prepare_model(parallel_strategy_kwargs={parallel_strategy_kwargs!r}) must be a "
            "dict or None."
        )
    device = get_device()
    if isinstance(move_to_device, torch.device):
        device = move_to_device
    elif not isinstance(move_to_device, bool):
        raise ConfigError(
            f"prepare_model(move_to_device={move_to_device!r}) must be True, False or a "
            "torch.device."
        )
    if move_to_device is not False:
        model = model.to(device)
    _, world_size = rank_and_world_size()
    if parallel_strategy is None or world_size == 1:
        return model
    if not (dist.is_available() and dist.is_initialized()):
        raise ConfigError(
            f"prepare_model(parallel_strategy='ddp') with {world_size} workers needs "
            "torch.distributed initialized: run the train function with "
            "cairn.torch.TorchTrainer (not cairn.Trainer), or pass parallel_strategy=None."
        )
    kwargs = dict(parallel_strategy_kwargs or {})
    if device.type == "cuda":
        kwargs.setdefault("device_ids", [device.index])
    logger.debug("Wrapping %s in DistributedDataParallel (world size %d)",
                 type(model).__name__, world_size)
    return nn.parallel.DistributedDataParallel(model, **kwargs)
