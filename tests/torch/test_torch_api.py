"""cairn.torch's front door, configs and process-group hooks, in one process."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist
from torch import nn

import cairn
import cairn.torch
from cairn._src.torch.process_group import (
    AttemptEnvironment,
    ProcessGroupSetup,
    choose_backend,
    destroy_process_group,
)
from cairn.torch import (
    TorchConfig,
    TorchTrainer,
    enable_reproducibility,
    get_device,
    get_devices,
    prepare_model,
)


def test_public_names_are_pinned_and_sorted() -> None:
    assert cairn.torch.__all__ == sorted(cairn.torch.__all__)
    assert cairn.torch.__all__ == [
        "FileSystemWriter",
        "PreparedDataLoader",
        "TorchConfig",
        "TorchTrainer",
        "TrainingState",
        "enable_reproducibility",
        "get_device",
        "get_devices",
        "load_training_state",
        "prepare_data_loader",
        "prepare_model",
        "report_snapshot",
        "save_training_state",
    ]
    for name in cairn.torch.__all__:
        assert getattr(cairn.torch, name).__module__.startswith("cairn._src.torch.")


def test_importing_cairn_torch_leaves_the_dcp_writer_for_its_first_use() -> None:
    # torch.distributed.checkpoint takes about half a second to import, on the path of
    # every worker's start: only FileSystemWriter needs it.
    code = ("import sys, cairn.torch; print('torch.distributed.checkpoint' in sys.modules); "
            "from cairn.torch import FileSystemWriter; "
            "print('torch.distributed.checkpoint' in sys.modules, FileSystemWriter.__name__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.split() == ["False", "True", "FileSystemWriter"]
    with pytest.raises(AttributeError, match=r"module 'cairn.torch' has no attribute 'Nope'"):
        cairn.torch.Nope  # noqa: B018


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"backend": "mpi"}, r"TorchConfig.backend='mpi' is not one of 'gloo', 'nccl'"),
        ({"timeout_s": 0}, r"TorchConfig.timeout_s=0 must be a number > 0"),
        ({"timeout_s": True}, r"TorchConfig.timeout_s=True"),
    ],
)
def test_torch_config_refuses_bad_values(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(cairn.ConfigError, match=match):
        TorchConfig(**kwargs)  # type: ignore[arg-type]


def test_torch_trainer_checks_its_own_argument_and_sets_its_hooks() -> None:
    def train() -> None:
        pass

    with pytest.raises(cairn.ConfigError, match=r"torch_config=\{'backend': 'gloo'\}"):
        TorchTrainer(train, torch_config={"backend": "gloo"})  # type: ignore[arg-type]
    trainer = TorchTrainer(train, scaling_config=cairn.ScalingConfig(num_workers=2))
    assert isinstance(trainer, cairn.Trainer)
    assert trainer.torch_config == TorchConfig()
    assert trainer._attempt_env is not None
    first, second = trainer._attempt_env(0), trainer._attempt_env(1)
    assert first["MASTER_ADDR"] == "127.0.0.1"
    assert int(first["MASTER_PORT"]) > 0 and int(second["MASTER_PORT"]) > 0


def test_threads_per_worker_yield_to_the_users_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert AttemptEnvironment(3)(0)["OMP_NUM_THREADS"] == "3"
    assert "OMP_NUM_THREADS" not in AttemptEnvironment(None)(0)
    user = TorchTrainer(lambda: None, run_config=cairn.RunConfig(
        worker_env={"OMP_NUM_THREADS": "4"}))
    assert user._attempt_env is not None
    assert "OMP_NUM_THREADS" not in user._attempt_env(0)


def test_a_spare_preloads_what_the_first_optimizer_would_import() -> None:
    # A warm standby spare imports CAIRN_PRELOAD while it waits; the first optimizer a
    # process builds imports torch._dynamo (about 800 modules), which must not be left on
    # the path of a replacement rank's first step.
    preload = AttemptEnvironment()(0)["CAIRN_PRELOAD"]
    code = ("import importlib, sys, torch\n"
            f"for name in {preload!r}.split(','): importlib.import_module(name)\n"
            "before = set(sys.modules)\n"
            "torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)\n"
            "print(len(set(sys.modules) - before))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.split() == ["0"]


def test_backend_choice_and_its_errors() -> None:
    assert choose_backend(TorchConfig(), use_gpu=False, rank=0) == "gloo"
    with pytest.raises(cairn.ConfigError, match=r"backend='nccl'\) needs GPUs"):
        choose_backend(TorchConfig(backend="nccl"), use_gpu=False, rank=0)
    if not torch.cuda.is_available():
        with pytest.raises(cairn.ConfigError, match=r"use_gpu=True\), but rank 1 sees no CUDA"):
            choose_backend(TorchConfig(), use_gpu=True, rank=1)


@dataclass(frozen=True)
class FakeContext:
    def get_world_rank(self) -> int:
        return 0

    def get_world_size(self) -> int:
        return 1

    def get_local_rank(self) -> int:
        return 0

    def get_local_world_size(self) -> int:
        return 1

    def get_node_rank(self) -> int:
        return 0


def test_setup_hook_initializes_and_teardown_destroys_the_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in AttemptEnvironment()(0).items():
        monkeypatch.setenv(name, value)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK"):
        # Set, then deleted: monkeypatch then removes what the hook sets once the test
        # ends (a delenv of an absent variable records nothing), so that no later test in
        # this process sees a torch.distributed environment.
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    ProcessGroupSetup(TorchConfig(timeout_s=60), use_gpu=False)(FakeContext())
    try:
        assert dist.is_initialized() and dist.get_backend() == "gloo"
        assert (os.environ["RANK"], os.environ["WORLD_SIZE"]) == ("0", "1")
        assert get_device() == torch.device("cpu")
    finally:
        destroy_process_group(FakeContext())
    assert not dist.is_initialized()


def test_prepare_model_outside_a_group() -> None:
    model = nn.Linear(2, 2)
    assert prepare_model(model) is model  # one process: no wrapper
    assert prepare_model(model, move_to_device=torch.device("cpu")) is model
    with pytest.raises(cairn.ConfigError, match=r"parallel_strategy='fsdp'\) is not one of"):
        prepare_model(model, parallel_strategy="fsdp")
    with pytest.raises(cairn.ConfigError, match=r"prepare_model\(model=3\)"):
        prepare_model(3)  # type: ignore[arg-type]
    with pytest.raises(cairn.ConfigError, match=r"move_to_device='cuda'"):
        prepare_model(model, move_to_device="cuda")  # type: ignore[arg-type]


def test_get_devices_outside_a_worker_is_the_cpu() -> None:
    assert get_devices() == [torch.device("cpu")] == [get_device()]


@pytest.fixture
def restore_determinism() -> object:
    saved = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark,
             os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    yield None
    torch.use_deterministic_algorithms(saved[0])
    torch.backends.cudnn.benchmark = saved[1]
    if saved[2] is None:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    else:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = saved[2]


def test_enable_reproducibility_seeds_and_makes_torch_deterministic(
    restore_determinism: object,
) -> None:
    import random

    import numpy

    enable_reproducibility(seed=3)
    first = (random.random(), float(numpy.random.rand()), float(torch.rand(1)))
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.backends.cudnn.benchmark is False
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    enable_reproducibility(3)
    assert (random.random(), float(numpy.random.rand()), float(torch.rand(1))) == first
    enable_reproducibility()  # Ray's default seed, 0
    with pytest.raises(cairn.ConfigError,
                       match=r"enable_reproducibility\(seed='7'\): the seed must be an integer"):
        enable_reproducibility(seed="7")  # type: ignore[arg-type]
