"""Setting up and tearing down ``torch.distributed`` in the workers of a run.

The driver picks a fresh rendezvous port for every attempt (:class:`AttemptEnvironment`),
so a restarted group never meets a port still held by the group it replaces. In each
worker, :class:`ProcessGroupSetup` exports the variables ``torchrun`` would
(``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``), picks the device (:func:`cuda_device`) and initializes the default
process group; :func:`destroy_process_group` ends it after the train function returned.

When the ranks run on several machines (the Ray backend), they meet at rank 0's node
instead (:func:`rendezvous_at_rank_zero`).

Why a collective never hangs a restart: when any worker raises, exits or is killed, the
controller kills every process of the group at once (SIGKILL) and starts a new group with
a new port. A rank blocked in an allreduce with a dead peer is killed with it; nothing
waits for ``TorchConfig.timeout_s``.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from cairn._src.backends.ray_resources import GPU_IDS_ENV
from cairn._src.errors import ConfigError
from cairn._src.torch.config import TorchConfig
from cairn._src.torch.placement import set_worker_device
from cairn._src.wire.bootstrap import NODE_ADDRESS_ENV
from cairn._src.worker.session import get_session

logger = logging.getLogger(__name__)

MASTER_ADDR = "127.0.0.1"


def free_port(host: str = MASTER_ADDR) -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class AttemptEnvironment:
    """Called by the driver before each attempt: the rendezvous address of its workers.

    ``threads_per_worker`` (when not None) becomes ``OMP_NUM_THREADS``, so N workers on
    one machine do not each start a thread per core; a value the user set in the driver's
    environment or in ``RunConfig.worker_env`` wins.
    """

    threads_per_worker: int | None = None

    def __call__(self, attempt: int) -> dict[str, str]:
        port = free_port()
        logger.info("Attempt %d: torch.distributed rendezvous at %s:%d", attempt, MASTER_ADDR,
                    port)
        # CAIRN_PRELOAD: a worker imports torch before it waits for its bootstrap, so a
        # warm standby worker (FailureConfig(warm_standby=True)) is ready with it; and
        # torch._dynamo, which the first optimizer a process builds imports (about 0.9 s
        # and 800 modules here), on the path of a replacement's first step otherwise.
        env = {"MASTER_ADDR": MASTER_ADDR, "MASTER_PORT": str(port),
               "CAIRN_PRELOAD": "torch,torch.distributed,torch._dynamo"}
        if self.threads_per_worker is not None:
            env["OMP_NUM_THREADS"] = str(self.threads_per_worker)
        return env


def choose_backend(config: TorchConfig, use_gpu: bool, rank: int) -> str:
    """The backend for this worker; :class:`ConfigError` when it cannot work here."""
    cuda = torch.cuda.is_available()
    if use_gpu and not cuda:
        raise ConfigError(
            f"ScalingConfig(use_gpu=True), but rank {rank} sees no CUDA device "
            "(torch.cuda.is_available() is False). Set use_gpu=False to train on CPUs "
            "with gloo, or install a CUDA build of torch."
        )
    if config.backend == "nccl" and not use_gpu:
        raise ConfigError(
            "TorchConfig(backend='nccl') needs GPUs: set ScalingConfig(use_gpu=True), or use "
            "backend='gloo' (or None) on CPUs."
        )
    if config.backend is not None:
        return config.backend
    return "nccl" if use_gpu else "gloo"


@dataclass(frozen=True)
class ProcessGroupSetup:
    """The set-up hook ``TorchTrainer`` runs in every worker before the train function."""

    config: TorchConfig
    use_gpu: bool

    def __call__(self, context: Any) -> None:
        rank, world_size = context.get_world_rank(), context.get_world_size()
        local_rank = context.get_local_rank()
        os.environ.update({
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(context.get_local_world_size()),
            "NODE_RANK": str(context.get_node_rank()),
        })
        if not self.use_gpu:
            # Hugging Face Accelerate sees a CPU process group only when told the run is on
            # CPUs: without it, Accelerator() runs each rank as a job of its own (no DDP,
            # every rank the main process, each saving its own model). A value the user
            # set wins.
            os.environ.setdefault("ACCELERATE_USE_CPU", "true")
        if "MASTER_ADDR" not in os.environ or "MASTER_PORT" not in os.environ:
            raise ConfigError(
                "MASTER_ADDR/MASTER_PORT are not set in this worker: the process group set-up "
                "of cairn.torch.TorchTrainer runs only in its own workers."
            )
        if context.get_local_world_size() < world_size:
            rendezvous_at_rank_zero(rank)
        backend = choose_backend(self.config, self.use_gpu, rank)
        device = torch.device("cpu")
        if self.use_gpu:
            device = cuda_device(rank, local_rank, context.get_local_world_size())
            torch.cuda.set_device(device)
        set_worker_device(device)
        dist.init_process_group(
            backend=backend,
            init_method="env://",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=self.config.timeout_s),
        )
        logger.debug("Rank %d: torch.distributed %s process group of %d on %s", rank, backend,
                     world_size, device)


def cuda_device(rank: int, local_rank: int, local_world_size: int) -> torch.device:
    """This worker's GPU; :class:`ConfigError` when it has none.

    On the Ray backend (:data:`GPU_IDS_ENV` set: the ids of the GPUs Ray gave this worker)
    ``CUDA_VISIBLE_DEVICES`` names the GPUs of all the workers of this node, and the worker
    trains on the one at the index of its own first GPU, as Ray Train's ``get_device()``
    does; workers with a fraction of a GPU share that device. Otherwise (the local
    backend: every GPU of the machine visible) ``cuda:<local rank>``.
    """
    count = torch.cuda.device_count()
    own = [gpu.strip() for gpu in os.environ.get(GPU_IDS_ENV, "").split(",") if gpu.strip()]
    if own:
        visible_env = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        visible = [gpu.strip() for gpu in visible_env.split(",")]
        if own[0] not in visible:
            raise ConfigError(
                f"Rank {rank} was given GPU {own[0]} by Ray, which CUDA_VISIBLE_DEVICES="
                f"{visible_env!r} does not name: leave CUDA_VISIBLE_DEVICES to Cairn on the "
                "Ray backend (it names the GPUs of all the workers of a node)."
            )
        index = visible.index(own[0])
        if index >= count:
            raise ConfigError(
                f"Rank {rank} was given GPU {own[0]} by Ray, device {index} of "
                f"CUDA_VISIBLE_DEVICES={visible_env!r}, but sees {count} CUDA device(s)."
            )
        return torch.device("cuda", index)
    if local_world_size > count:
        raise ConfigError(
            f"ScalingConfig(num_workers={local_world_size}, use_gpu=True) on a machine with "
            f"{count} CUDA device(s): each worker needs its own GPU; use at most {count} "
            "workers."
        )
    return torch.device("cuda", local_rank)


def rendezvous_at_rank_zero(rank: int) -> None:
    """Ranks on several machines (the Ray backend): meet at rank 0's node, on a port free
    there, instead of the driver's loopback address.

    Rank 0 picks its address toward the driver (``CAIRN_NODE_ADDRESS``, which the worker
    runtime sets) and a free port on it, and every rank gets both through Cairn's own
    broadcast (the control channel), before ``init_process_group``."""
    chosen = ("", 0)
    if rank == 0:
        host = os.environ.get(NODE_ADDRESS_ENV, MASTER_ADDR)
        chosen = (host, free_port(host))
    host, port = get_session("TorchTrainer").collectives.broadcast_from_rank_zero(chosen)
    os.environ.update({"MASTER_ADDR": host, "MASTER_PORT": str(port)})
    if rank == 0:
        logger.info("torch.distributed rendezvous at rank 0's node, %s:%d (the ranks run on "
                    "several nodes)", host, port)


@dataclass(frozen=True)
class LocalDeviceSetup:
    """``TorchTrainer``'s set-up hook in local mode (``num_workers=0``): the device only.

    As in Ray Train's local mode, no process group is formed and the driver's environment
    is left alone (no ``RANK``/``MASTER_ADDR``): ``cuda:0`` with
    ``ScalingConfig(use_gpu=True)`` (or the device ``torch.cuda`` already had selected),
    the CPU otherwise.
    """

    use_gpu: bool

    def __call__(self, context: Any) -> None:
        device = torch.device("cpu")
        if self.use_gpu:
            if not torch.cuda.is_available():
                raise ConfigError(
                    "ScalingConfig(num_workers=0, use_gpu=True), but this process sees no "
                    "CUDA device (torch.cuda.is_available() is False). Set use_gpu=False to "
                    "train on the CPU, or install a CUDA build of torch."
                )
            device = torch.device("cuda", torch.cuda.current_device())
        set_worker_device(device)


def destroy_process_group(context: Any) -> None:
    """The teardown hook: ends the default process group after the train function returned.

    A failed attempt never gets here: its processes are killed, which ends the group.
    """
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    set_worker_device(None)
