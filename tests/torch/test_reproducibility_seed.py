"""``enable_reproducibility(seed=s)`` in a train function seeds what
``prepare_data_loader`` called later in that attempt without its own ``seed`` does: the
data order of every rank and the seeds of the DataLoader's worker processes. Real runs:
two worker processes, and local mode for the attempts of one process."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

import cairn
from cairn import FailureConfig, ScalingConfig, Trainer
from cairn.torch import (
    TorchTrainer,
    enable_reproducibility,
    load_training_state,
    prepare_data_loader,
    save_training_state,
)

RunConfigFactory = Callable[..., cairn.RunConfig]
SIZE = 12


@pytest.fixture(autouse=True)
def restore_determinism() -> Iterator[None]:
    """enable_reproducibility in local mode turns deterministic algorithms on in this
    process; later tests get torch as they had it."""
    saved = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark,
             os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    yield
    torch.use_deterministic_algorithms(saved[0])
    torch.backends.cudnn.benchmark = saved[1]
    if saved[2] is None:
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    else:
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = saved[2]


class Augmented(Dataset[torch.Tensor]):
    """Each sample: its index and a random "augmentation" drawn where it is loaded."""

    def __len__(self) -> int:
        return SIZE

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([float(index), float(torch.rand(()))])


def _sampler_order(rank: int, world_size: int, seed: int, epoch: int = 0) -> list[int]:
    sampler = DistributedSampler(TensorDataset(torch.arange(SIZE)), num_replicas=world_size,
                                 rank=rank, shuffle=True, seed=seed)
    sampler.set_epoch(epoch)
    return list(sampler)


# --- workloads ---------------------------------------------------------------------------


def seed_sweep(config: dict[str, Any]) -> None:
    """For each seed of the sweep: enable_reproducibility, then a shuffled loader whose
    samples are loaded in one DataLoader worker process; this rank's epoch-0 order and
    augmentation draws go to ``rank_<r>.json`` in the scratch directory."""
    seen: dict[str, Any] = {}
    for seed in config["seeds"]:
        enable_reproducibility(seed=seed)
        loader = prepare_data_loader(
            DataLoader(Augmented(), batch_size=SIZE, shuffle=True, num_workers=1))
        (batch,) = list(loader)
        seen[str(seed)] = {"order": batch[:, 0].int().tolist(), "draws": batch[:, 1].tolist()}
    rank = cairn.get_context().get_world_rank()
    with open(os.path.join(config["scratch"], f"rank_{rank}.json"), "w") as f:
        json.dump(seen, f)


def resumed_mid_epoch(config: dict[str, Any]) -> dict[str, Any]:
    """Attempt 0 reads two batches, saves the training state, reports it and fails; the
    next attempt restores it and reads the rest of the epoch. Each attempt first prepares
    a loader before enable_reproducibility (the seed of the attempt before must not reach
    it), then enables reproducibility and prepares the loader it trains with."""
    context = cairn.get_context()
    early = prepare_data_loader(
        DataLoader(TensorDataset(torch.arange(SIZE)), batch_size=2, shuffle=True))
    enable_reproducibility(seed=config["seed"])
    model = nn.Linear(1, 1)
    loader = prepare_data_loader(
        DataLoader(TensorDataset(torch.arange(SIZE)), batch_size=2, shuffle=True))
    checkpoint = cairn.get_checkpoint()
    if checkpoint is not None:
        load_training_state(checkpoint, model=model, data_loader=loader)
    batches = iter(loader)
    read: list[int] = []
    if context.get_attempt() == 0:
        read += next(batches)[0].tolist() + next(batches)[0].tolist()
        with tempfile.TemporaryDirectory() as directory:
            save_training_state(directory, model=model, data_loader=loader)
            cairn.report({"read": len(read)},
                         checkpoint=cairn.Checkpoint.from_directory(directory))
        config["attempts"].append({"early": _first_epoch(early), "read": read})
        raise RuntimeError("fails after the checkpoint, mid-epoch")
    read += [i for (batch,) in batches for i in batch.tolist()]
    config["attempts"].append({"early": _first_epoch(early), "read": read})
    return config["attempts"]


def _first_epoch(loader: Any) -> list[int]:
    return [i for (batch,) in loader for i in batch.tolist()]


def without_a_seed(config: dict[str, Any]) -> list[int]:
    loader = prepare_data_loader(
        DataLoader(TensorDataset(torch.arange(SIZE)), batch_size=2, shuffle=True))
    return _first_epoch(loader)


# --- tests -------------------------------------------------------------------------------


def test_a_sweep_over_seeds_changes_every_ranks_order_and_worker_draws(
    run_config: RunConfigFactory, scratch: str,
) -> None:
    seeds = [1, 2]
    TorchTrainer(seed_sweep, train_loop_config={"seeds": seeds, "scratch": scratch},
                 scaling_config=ScalingConfig(num_workers=2),
                 run_config=run_config(name="sweep")).fit()
    for rank in (0, 1):
        with open(os.path.join(scratch, f"rank_{rank}.json")) as f:
            seen = json.load(f)
        for seed in seeds:
            assert seen[str(seed)]["order"] == _sampler_order(rank, 2, seed), (rank, seed)
        # The DataLoader worker process is seeded from (seed, epoch, rank): its draws
        # follow the seed too.
        assert seen["1"]["draws"] != seen["2"]["draws"], rank
    assert _sampler_order(0, 2, 1) != _sampler_order(0, 2, 0)


def test_the_seed_counts_in_its_own_attempt_and_a_resume_is_exact(
    run_config: RunConfigFactory,
) -> None:
    attempts: list[dict[str, Any]] = []
    result = Trainer(
        resumed_mid_epoch, train_loop_config={"seed": 5, "attempts": attempts},
        scaling_config=ScalingConfig(num_workers=0),
        run_config=run_config(name="resumed", failure_config=FailureConfig(max_failures=1)),
    ).fit()
    assert result.error is None and len(attempts) == 2
    # The restored attempt read the rest of the epoch that seed 5 orders, no more, no less.
    assert attempts[0]["read"] + attempts[1]["read"] == _sampler_order(0, 1, seed=5)
    # A loader prepared before enable_reproducibility keeps seed 0, also in the process
    # that ran the attempt before with seed 5 (a fresh process would not have it).
    assert attempts[0]["early"] == attempts[1]["early"] == _sampler_order(0, 1, seed=0)
    # Nor does a later run in this process inherit it.
    later = Trainer(without_a_seed, scaling_config=ScalingConfig(num_workers=0),
                    run_config=run_config(name="later")).fit()
    assert later.return_value == _sampler_order(0, 1, seed=0)


def test_an_explicit_seed_wins_and_outside_a_train_function_nothing_is_inherited() -> None:
    enable_reproducibility(seed=9)  # in the test process, outside any train function
    loader = prepare_data_loader(
        DataLoader(TensorDataset(torch.arange(SIZE)), batch_size=2, shuffle=True))
    assert _first_epoch(loader) == _sampler_order(0, 1, seed=0)
    explicit = prepare_data_loader(
        DataLoader(TensorDataset(torch.arange(SIZE)), batch_size=2, shuffle=True), seed=3)
    assert _first_epoch(explicit) == _sampler_order(0, 1, seed=3)
