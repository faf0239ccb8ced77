"""``TorchTrainer``: a ``Trainer`` whose workers run inside a ``torch.distributed`` group."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cairn._src.errors import ConfigError
from cairn._src.torch.config import TorchConfig
from cairn._src.torch.process_group import (
    AttemptEnvironment,
    LocalDeviceSetup,
    ProcessGroupSetup,
    destroy_process_group,
)
from cairn._src.train.local_mode import check_not_under_torchrun
from cairn._src.train.trainer import TRAINER_OPTIONS, Trainer

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from cairn._src.train.trainer import TrainerOptions


class TorchTrainer(Trainer):
    """Runs ``train_loop_per_worker`` on N workers joined in one ``torch.distributed`` group.

    Before the train function starts, every worker has the default process group
    initialized (``torch.distributed.is_initialized()``): ``gloo`` on CPUs, ``nccl`` with
    ``ScalingConfig(use_gpu=True)`` (one GPU per worker, ``cuda:<local rank>``), or
    ``TorchConfig(backend=...)``. The workers also get the variables ``torchrun`` sets
    (``MASTER_ADDR=127.0.0.1``, or rank 0's node address when the ranks run on several
    nodes, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``LOCAL_WORLD_SIZE``), and, unless the driver's environment or
    ``RunConfig.worker_env`` sets it, ``OMP_NUM_THREADS`` = CPU cores // workers.

    Restarts never hang in a collective: a worker that fails makes Cairn kill every
    process of the group (SIGKILL), including ranks blocked in an allreduce with it, and
    the next attempt rendezvouses on a fresh port. After the train function returns (and
    its pending uploads commit) the process group is destroyed.

    With ``ScalingConfig(num_workers=0)`` (local mode) the train function runs in the
    driver's process without a process group, on ``cuda:0`` with ``use_gpu=True``, else on
    the CPU; a launch under ``torchrun`` with more than one process is refused at ``fit()``
    (see ``docs/local-mode.md``).

    Everything else is :class:`cairn.Trainer`: ``fit()``, checkpoints, restarts, resume.
    """

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        torch_config: TorchConfig | None = None,
        **options: Unpack[TrainerOptions],
    ) -> None:
        # The other arguments are Trainer's, checked there; only their names here, so
        # that a mistyped one names this class, as Python would.
        for name in options:
            if name not in TRAINER_OPTIONS:
                raise TypeError(
                    f"TorchTrainer.__init__() got an unexpected keyword argument {name!r}")
        super().__init__(train_loop_per_worker, **options)
        if torch_config is not None and not isinstance(torch_config, TorchConfig):
            raise ConfigError(
                f"torch_config={torch_config!r} must be a cairn.torch.TorchConfig or None."
            )
        self.torch_config = torch_config or TorchConfig()
        if self.scaling_config.local_mode:
            self._setup_hooks.append(LocalDeviceSetup(self.scaling_config.use_gpu))
        else:
            self._setup_hooks.append(ProcessGroupSetup(self.torch_config,
                                                       self.scaling_config.use_gpu))
            self._attempt_env = AttemptEnvironment(self._threads_per_worker())
        self._teardown_hooks.append(destroy_process_group)

    def _check_local_mode(self) -> None:
        check_not_under_torchrun()

    def _threads_per_worker(self) -> int | None:
        if "OMP_NUM_THREADS" in os.environ or "OMP_NUM_THREADS" in (
            self.run_config.worker_env or {}
        ):
            return None
        return max(1, (os.cpu_count() or 1) // self.scaling_config.max_workers)
