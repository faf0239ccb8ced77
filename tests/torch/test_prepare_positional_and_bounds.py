"""cairn.torch's prepare functions and TorchConfig take Ray Train 2.60's positional
arguments, and refuse at the call the values torch cannot take later (a seed whose
``seed + epoch`` overflows torch's generator, a timeout torch cannot count down)."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import cairn
from cairn.torch import TorchConfig, prepare_data_loader, prepare_model

MAX_SEED = 2**63 - 1


def _shuffled(size: int = 8) -> DataLoader[Any]:
    return DataLoader(TensorDataset(torch.arange(size)), batch_size=2, shuffle=True)


def _order(loader: Any) -> list[int]:
    return [i for (batch,) in loader for i in batch.tolist()]


# --- Ray Train's positional arguments -----------------------------------------------------


def test_torch_config_takes_the_backend_by_position_as_ray_does() -> None:
    assert TorchConfig("gloo") == TorchConfig(backend="gloo")
    # Ray's second argument is init_method, which Cairn does not take: timeout_s stays a
    # keyword, so a ported TorchConfig("gloo", "env") is a TypeError, not a wrong timeout.
    with pytest.raises(TypeError, match=r"takes from 1 to 2 positional arguments"):
        TorchConfig("gloo", "env")  # type: ignore[misc]
    assert TorchConfig("nccl", timeout_s=60).timeout_s == 60


def test_prepare_model_takes_rays_positional_arguments() -> None:
    model = nn.Linear(2, 2)
    assert prepare_model(model, True, "ddp") is model  # one process: no wrapper
    assert prepare_model(model, torch.device("cpu"), None, None) is model
    with pytest.raises(cairn.ConfigError, match=re.escape(
            "prepare_model(parallel_strategy='fsdp') is not one of 'ddp', None. Cairn has "
            "no FSDP wrapper: wrap the model with torch.distributed.fsdp yourself "
            "(TorchTrainer has initialized the process group) and pass "
            "parallel_strategy=None.")):
        prepare_model(model, True, "fsdp")
    with pytest.raises(cairn.ConfigError, match=r"parallel_strategy_kwargs=\[1\]"):
        prepare_model(model, True, "ddp", [1])  # type: ignore[arg-type]


def test_prepare_data_loader_takes_rays_positional_arguments() -> None:
    original = _shuffled()
    kept = prepare_data_loader(original, False, False)
    assert kept.data_loader is original  # add_dist_sampler=False keeps the loader
    rebuilt = prepare_data_loader(original, True, True)
    assert rebuilt.data_loader is not original
    assert isinstance(rebuilt.data_loader.sampler, DistributedSampler)
    with pytest.raises(cairn.ConfigError, match=r"prepare_data_loader\(move_to_device=1\)"):
        prepare_data_loader(original, True, 1)  # type: ignore[arg-type]
    # Ray's fourth, auto_transfer, is not taken; seed is Cairn's own and keyword-only.
    with pytest.raises(TypeError, match=r"takes from 1 to 3 positional arguments"):
        prepare_data_loader(original, True, True, False)  # type: ignore[misc]


# --- values torch cannot take ------------------------------------------------------------


@pytest.mark.parametrize("timeout", [float("inf"), float("-inf"), float("nan"), 1e12,
                                     9.3e9, 10**400, 0, -1])
def test_torch_config_refuses_a_timeout_torch_cannot_count_down(timeout: float) -> None:
    with pytest.raises(cairn.ConfigError, match=re.escape(
            f"TorchConfig.timeout_s={timeout!r} must be a number > 0 and <= 1e9 (seconds, "
            "about 31 years: the longest timeout torch's process group can count down; "
            "pass 1e9 for no practical limit).")):
        TorchConfig(timeout_s=timeout)


def test_torch_config_takes_timeouts_up_to_the_bound() -> None:
    assert TorchConfig(timeout_s=1e9).timeout_s == 1e9
    assert TorchConfig(timeout_s=0.5).timeout_s == 0.5


@pytest.mark.parametrize("seed", [2**64, 2**64 - 1, 2**63, -1, 1.0, True])
def test_prepare_data_loader_refuses_a_seed_torch_cannot_take(seed: Any) -> None:
    with pytest.raises(cairn.ConfigError, match=re.escape(
            f"prepare_data_loader(seed={seed!r}) must be an integer from 0 to 2**63 - 1 "
            "(torch seeds the sampler with seed + epoch, which must stay below 2**64), or "
            "None for the seed of enable_reproducibility() (else 0).")):
        prepare_data_loader(_shuffled(), seed=seed)
    with pytest.raises(cairn.ConfigError, match=r"must be an integer from 0 to 2\*\*63 - 1"):
        prepare_data_loader(_shuffled(), add_dist_sampler=False, seed=seed)


def test_the_largest_seed_and_epoch_still_give_torchs_order() -> None:
    loader = prepare_data_loader(_shuffled(), seed=MAX_SEED)
    for epoch in range(3):
        sampler = DistributedSampler(TensorDataset(torch.arange(8)), num_replicas=1, rank=0,
                                     shuffle=True, seed=MAX_SEED)
        sampler.set_epoch(epoch)
        assert _order(loader) == list(sampler)
    loader.set_epoch(MAX_SEED)  # seed + epoch = 2**64 - 2: torch still takes it
    assert sorted(_order(loader)) == list(range(8))
    with pytest.raises(cairn.ConfigError, match=re.escape(
            f"set_epoch(epoch={2**63}) must be an integer from 0 to 2**63 - 1.")):
        loader.set_epoch(2**63)
    with pytest.raises(cairn.ConfigError, match=r"set_epoch\(epoch=18446744073709551616\)"):
        loader.sampler.set_epoch(2**64)


def test_a_users_distributed_sampler_with_a_seed_torch_cannot_take_is_refused() -> None:
    dataset = TensorDataset(torch.arange(8))
    own = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=2**64 - 1)
    with pytest.raises(cairn.ConfigError, match=re.escape(
            "prepare_data_loader(data_loader=...) has a DistributedSampler with "
            f"seed={2**64 - 1}, which torch cannot take with the epoch added (seed + epoch "
            "must stay below 2**64); give it a seed from 0 to 2**63 - 1.")):
        prepare_data_loader(DataLoader(dataset, batch_size=2, sampler=own))
    # Unshuffled, the seed is never used: kept as torch keeps it.
    unshuffled = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=False,
                                    seed=2**64 - 1)
    loader = prepare_data_loader(DataLoader(dataset, batch_size=2, sampler=unshuffled))
    assert _order(loader) == list(range(8))


def test_a_stored_position_past_the_largest_epoch_is_refused_at_load() -> None:
    # The position comes back from a checkpoint's rank_state.pt (read from storage).
    loader = prepare_data_loader(DataLoader(TensorDataset(torch.arange(4.0)), batch_size=2))
    with pytest.raises(cairn.ConfigError, match=re.escape(
            "load_state_dict(state={'epoch': 9223372036854775808, 'batch': 0}) must be "
            "{'epoch': int from 0 to 2**63 - 1, 'batch': int >= 0}, as state_dict() "
            "returns.")):
        loader.load_state_dict({"epoch": 2**63, "batch": 0})
    loader.load_state_dict({"epoch": 2**63 - 1, "batch": 1})
    assert loader.state_dict() == {"epoch": 2**63 - 1, "batch": 1}


def test_a_kept_loader_prepared_again_draws_the_same_order() -> None:
    # The generator Cairn set on the user's loader the first time is Cairn's: preparing
    # the loader again (local mode hands the driver's own objects to each attempt) keeps
    # reseeding it, so the same seed gives the same order.
    loader = DataLoader(list(range(8)), batch_size=2, shuffle=True)
    orders = [[b.tolist() for b in prepare_data_loader(loader, add_dist_sampler=False,
                                                       move_to_device=False, seed=3)]
              for _ in range(3)]
    assert orders[0] == orders[1] == orders[2]
    # A generator of the user's own is still theirs: not reseeded.
    own = torch.Generator()
    mine = DataLoader(list(range(8)), batch_size=2, shuffle=True, generator=own)
    prepare_data_loader(mine, add_dist_sampler=False, move_to_device=False)
    assert mine.generator is own
