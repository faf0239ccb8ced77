"""Where this process trains: its rank, its world size and its torch device."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from cairn._src.errors import ReportError
from cairn._src.worker.session import get_session

_worker_device: torch.device | None = None


def set_worker_device(device: torch.device | None) -> None:
    """Set by ``TorchTrainer``'s set-up hook in each worker (None: back to the CPU)."""
    global _worker_device
    _worker_device = device


def get_device() -> torch.device:
    """The device this worker trains on.

    ``cuda:<n>`` in a :class:`~cairn.torch.TorchTrainer` worker with
    ``ScalingConfig(use_gpu=True)``, ``cpu`` otherwise, also outside a worker: ``n`` is
    the local rank on the local backend, and on the Ray backend the index of the worker's
    own GPU among those of its node's workers (``process_group.cuda_device``).
    """
    return _worker_device if _worker_device is not None else torch.device("cpu")


def get_devices() -> list[torch.device]:
    """Every device this worker trains on, as Ray Train's ``get_devices()``.

    A Cairn worker has one device (one GPU per worker with ``use_gpu=True``), so this is
    ``[get_device()]``: ``[cuda:<n>]`` on a GPU worker, ``[cpu]`` otherwise.
    """
    return [get_device()]


def rank_and_world_size() -> tuple[int, int]:
    """``(rank, world size)``: from the Cairn worker's context, else from an initialized
    ``torch.distributed`` process group, else ``(0, 1)``."""
    try:
        context = get_session("get_context").context
    except ReportError:
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1
    return context.get_world_rank(), context.get_world_size()


def move_to_device(value: Any, device: torch.device, *, non_blocking: bool = False) -> Any:
    """``value`` with every tensor in it (nested in dicts, lists and tuples) on ``device``."""
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=non_blocking)
    if isinstance(value, Mapping):
        items = {k: move_to_device(v, device, non_blocking=non_blocking) for k, v in value.items()}
        try:
            return type(value)(items)  # type: ignore[call-arg]
        except TypeError:  # a mapping type that cannot be built from a dict
            return items
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(move_to_device(v, device, non_blocking=non_blocking) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(move_to_device(v, device, non_blocking=non_blocking) for v in value)
    return value
