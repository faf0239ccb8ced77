"""save_training_state / load_training_state in one process (rank 0 of 1)."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import cairn
from cairn._src.torch import data_loader as data_loader_module
from cairn._src.torch import training_state
from cairn.torch import TrainingState, load_training_state, prepare_data_loader, save_training_state


def build(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer, object]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    return model, optimizer, scheduler


def train_steps(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: object,
                steps: int) -> None:
    for _ in range(steps):
        x = torch.randn(5, 4)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()  # type: ignore[attr-defined]


def draws() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_round_trip_restores_everything_and_the_random_streams(tmp_path: Path) -> None:
    model, optimizer, scheduler = build()
    loader = prepare_data_loader(DataLoader(TensorDataset(torch.arange(12)), batch_size=3,
                                            shuffle=True))
    train_steps(model, optimizer, scheduler, 3)
    batches = iter(loader)  # held: a pass in progress (a released one would count as done)
    next(batches)
    random.seed(1)
    np.random.seed(2)
    written = save_training_state(tmp_path, model=model, optimizer=optimizer,
                                  scheduler=scheduler, data_loader=loader, step=3, epoch=0,
                                  extra={"best": 0.5, "history": [1, 2]})
    assert written == ["model.pt", "optimizer.pt", "progress.pt", "rank_0/rank_state.pt",
                       "scheduler.pt"]
    train_steps(model, optimizer, scheduler, 2)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    expected_lr = optimizer.param_groups[0]["lr"]
    expected_draws = draws()

    fresh_model, fresh_optimizer, fresh_scheduler = build(seed=99)
    fresh_loader = prepare_data_loader(DataLoader(TensorDataset(torch.arange(12)),
                                                  batch_size=3, shuffle=True))
    state = load_training_state(str(tmp_path), model=fresh_model, optimizer=fresh_optimizer,
                                scheduler=fresh_scheduler, data_loader=fresh_loader)
    assert state == TrainingState(step=3, epoch=0, extra={"best": 0.5, "history": [1, 2]},
                                  data_loader_position={"epoch": 0, "batch": 1}, world_size=1)
    assert fresh_loader.state_dict() == {"epoch": 0, "batch": 1}
    # The random streams are back where they were at save time: training on gives the
    # same parameters, bit for bit, and the same draws from random, NumPy and torch.
    train_steps(fresh_model, fresh_optimizer, fresh_scheduler, 2)
    for name, tensor in fresh_model.state_dict().items():
        assert torch.equal(tensor, expected[name]), name
    assert fresh_optimizer.param_groups[0]["lr"] == expected_lr
    assert draws() == expected_draws


def test_load_from_a_checkpoint_object_and_without_optimizer(tmp_path: Path) -> None:
    model, _, _ = build()
    save_training_state(tmp_path, model=model, step=7, epoch=2)
    other, optimizer, _ = build(seed=5)
    state = load_training_state(cairn.Checkpoint.from_directory(tmp_path), model=other,
                                restore_rng=False)
    assert (state.step, state.epoch, state.data_loader_position) == (7, 2, None)
    for name, tensor in other.state_dict().items():
        assert torch.equal(tensor, model.state_dict()[name])
    with pytest.raises(cairn.CheckpointNotFoundError, match=r"has no optimizer\.pt"):
        load_training_state(tmp_path, model=other, optimizer=optimizer)


def test_bad_arguments_and_foreign_directories_are_refused(tmp_path: Path) -> None:
    model, _, _ = build()
    with pytest.raises(cairn.ConfigError, match=r"save_training_state\(model='not a model'\)"):
        save_training_state(tmp_path, model="not a model")  # type: ignore[arg-type]
    with pytest.raises(cairn.ConfigError, match=r"save_training_state\(step=-1\)"):
        save_training_state(tmp_path, model=model, step=-1)
    with pytest.raises(cairn.ConfigError, match=r"save_training_state\(optimizer=3\)"):
        save_training_state(tmp_path, model=model, optimizer=3)
    with pytest.raises(cairn.ConfigError, match=r"extra=\[1\]"):
        save_training_state(tmp_path, model=model, extra=[1])  # type: ignore[arg-type]
    os.makedirs(tmp_path / "empty")
    with pytest.raises(cairn.CheckpointNotFoundError, match=r"holds no progress\.pt"):
        load_training_state(tmp_path / "empty", model=model)
    with pytest.raises(cairn.ConfigError, match=r"checkpoint=3\)"):
        load_training_state(3, model=model)  # type: ignore[arg-type]


def test_a_model_file_torch_cannot_map_is_read(tmp_path: Path) -> None:
    # The model file is memory-mapped; one in torch's legacy format (not mappable) is read.
    model, optimizer, _ = build(seed=1)
    save_training_state(tmp_path, model=model, optimizer=optimizer, step=3)
    path = tmp_path / "model.pt"
    state = torch.load(path, weights_only=True)
    torch.save(state, path, _use_new_zipfile_serialization=False)
    fresh, fresh_optimizer, _ = build(seed=2)
    assert load_training_state(str(tmp_path), model=fresh, optimizer=fresh_optimizer).step == 3
    for name, tensor in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], tensor), name


class _Assigning(nn.Linear):
    """A module whose load keeps the given tensors instead of copying them (as a custom
    ``_load_from_state_dict`` may)."""

    def _load_from_state_dict(self, state_dict: Any, prefix: str, *args: Any) -> None:
        self.weight = nn.Parameter(state_dict[prefix + "weight"], requires_grad=False)
        self.bias = nn.Parameter(state_dict[prefix + "bias"], requires_grad=False)


@pytest.mark.parametrize("module", [nn.Linear(3, 2), _Assigning(3, 2)],
                         ids=["copies", "assigns"])
def test_a_kept_ranks_held_model_is_loaded_without_a_copy_and_never_kept_by_the_model(
    module: nn.Module, monkeypatch: pytest.MonkeyPatch,
) -> None:
    held = {"weight": torch.arange(6.0).reshape(2, 3), "bias": torch.ones(2)}
    before = {name: tensor.clone() for name, tensor in held.items()}
    copies: list[object] = []
    real_deepcopy = training_state.copy.deepcopy

    def counting(value: Any, *args: Any) -> Any:
        copies.append(value)
        return real_deepcopy(value, *args)

    monkeypatch.setattr(training_state.copy, "deepcopy", counting)
    training_state._load_model(module, held, shared=True)
    with torch.no_grad():
        for tensor in module.state_dict().values():
            tensor.add_(1.0)  # training goes on: the held copy must not change
    assert all(torch.equal(held[name], before[name]) for name in held)
    assert torch.equal(module.state_dict()["weight"], before["weight"] + 1)
    # A deep copy only for the module that kept the held tensors.
    assert sum(value is held for value in copies) == (1 if isinstance(module, _Assigning)
                                                      else 0)


# --- another world size ------------------------------------------------------------------


def as_rank(monkeypatch: pytest.MonkeyPatch, rank: int, world_size: int) -> None:
    for module in (training_state, data_loader_module):
        monkeypatch.setattr(module, "rank_and_world_size", lambda: (rank, world_size))


def make_loader(monkeypatch: pytest.MonkeyPatch, rank: int, world_size: int,
                batch_size: int) -> Any:
    as_rank(monkeypatch, rank, world_size)
    return prepare_data_loader(DataLoader(TensorDataset(torch.arange(20)),
                                          batch_size=batch_size, shuffle=True))


def samples(batches: Any) -> list[int]:
    return [i for batch in batches for i in batch[0].tolist()]


def test_a_grown_world_resumes_every_rank_at_rank_zeros_position(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, _, _ = build()
    loader = make_loader(monkeypatch, 0, 1, batch_size=4)
    list(loader)  # epoch 0
    batches = iter(loader)
    seen = samples([next(batches), next(batches)])
    assert loader.state_dict() == {"epoch": 1, "batch": 2}
    save_training_state(tmp_path, model=model, data_loader=loader, step=7)
    rest = samples(batches)  # what the one-worker run reads in the rest of epoch 1

    resumed: dict[int, tuple[Any, TrainingState]] = {}
    for rank in (1, 0):  # rank 1 has no rank_state.pt: the world grew from 1 to 2
        fresh = make_loader(monkeypatch, rank, 2, batch_size=4)
        fresh_model = build(seed=9)[0]
        torch.manual_seed(100 + rank)
        state = load_training_state(tmp_path, model=fresh_model, data_loader=fresh)
        resumed[rank] = fresh, state
        if rank == 1:  # no RNG of its own to restore: it keeps its own stream
            assert not state.rank_state_restored
            assert torch.equal(torch.rand(2), torch.manual_seed(101) and torch.rand(2))
    positions = {rank: fresh.state_dict() for rank, (fresh, _) in resumed.items()}
    # The 8 indices read by 1 rank are 1 batch of 4 on each of 2 ranks.
    assert positions == {0: {"epoch": 1, "batch": 1}, 1: {"epoch": 1, "batch": 1}}
    assert resumed[1][1].data_loader_position == {"epoch": 1, "batch": 1}
    assert resumed[0][0].epoch == resumed[1][0].epoch == 1
    passes = {rank: list(fresh) for rank, (fresh, _) in resumed.items()}
    assert len(passes[0]) == len(passes[1]) == 2  # every rank steps as often
    # Together they read exactly the rest of the epoch, nothing twice and nothing skipped.
    assert sorted(samples(passes[0]) + samples(passes[1])) == sorted(rest)
    assert not set(rest) & set(seen)
    assert all(fresh.state_dict() == {"epoch": 2, "batch": 0} for fresh, _ in resumed.values())


@pytest.mark.parametrize("batch_size", [2, 3])
def test_a_shrunk_world_resumes_every_rank_at_one_position_with_its_own_rngs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch_size: int,
) -> None:
    model, _, _ = build()
    seen: list[int] = []
    held = []
    for rank in range(4):  # 4 ranks of 5 samples: 3 batches of 2 each
        loader = make_loader(monkeypatch, rank, 4, batch_size=2)
        held.append(iter(loader))
        seen += samples([next(held[-1])])
        torch.manual_seed(200 + rank)
        save_training_state(tmp_path, model=model, data_loader=loader, step=3)
        assert loader.state_dict() == {"epoch": 0, "batch": 1}
    # 8 indices read by 4 ranks: 2 batches of 2 on each of 2 ranks (nothing read twice);
    # with batches of 3, 1 batch on each (6 indices), and the 2 between are read again.
    expected_batch, rest_batches, rest_samples = {2: (2, 3, 6), 3: (1, 3, 7)}[batch_size]
    for rank in range(2):
        fresh = make_loader(monkeypatch, rank, 2, batch_size=batch_size)
        state = load_training_state(tmp_path, model=build(seed=9)[0], data_loader=fresh)
        assert state.rank_state_restored and state.world_size == 4
        assert torch.equal(torch.rand(2), torch.manual_seed(200 + rank) and torch.rand(2))
        assert fresh.state_dict() == {"epoch": 0, "batch": expected_batch}
        rest = list(fresh)
        assert len(rest) == rest_batches
        assert sum(len(batch[0]) for batch in rest) == rest_samples
        seen += samples(rest)
    assert set(seen) == set(range(20))  # none skipped
    assert len(seen) == 8 + 2 * rest_samples


def test_a_rank_without_its_file_in_the_same_world_takes_rank_zeros_position(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, _, _ = build()
    loader = make_loader(monkeypatch, 0, 2, batch_size=3)
    batches = iter(loader)
    next(batches)
    save_training_state(tmp_path, model=model, data_loader=loader)  # rank 1 saved nothing
    fresh = make_loader(monkeypatch, 1, 2, batch_size=3)
    state = load_training_state(tmp_path, model=build(seed=9)[0], data_loader=fresh)
    assert not state.rank_state_restored
    assert fresh.state_dict() == state.data_loader_position == {"epoch": 0, "batch": 1}


# --- compiled and wrapped models ---------------------------------------------------------


def test_compiled_and_wrapped_models_save_and_load_as_the_plain_model(tmp_path: Path) -> None:
    model, _, _ = build()
    plain_keys = list(model.state_dict())
    wrappers = {
        "compiled": lambda m: torch.compile(m),
        "compiled_parallel": lambda m: torch.compile(nn.DataParallel(m)),
        "parallel_compiled": lambda m: nn.DataParallel(torch.compile(m)),
    }
    for name, wrap in wrappers.items():
        wrapped = wrap(model)
        assert training_state.unwrap_model(wrapped) is model
        save_training_state(tmp_path / name, model=wrapped, step=1)
        saved = torch.load(tmp_path / name / "model.pt", weights_only=True)
        assert list(saved) == plain_keys, name
        fresh, _, _ = build(seed=9)
        fresh.load_state_dict(saved)  # model.pt loads into a plain model
        load_training_state(tmp_path / name, model=fresh)
        for key, tensor in model.state_dict().items():
            assert torch.equal(fresh.state_dict()[key], tensor), (name, key)
    # And a plain model's state loads into a compiled (and wrapped) one.
    save_training_state(tmp_path / "plain", model=model)
    for name, wrap in wrappers.items():
        fresh, _, _ = build(seed=9)
        load_training_state(tmp_path / "plain", model=wrap(fresh))
        for key, tensor in model.state_dict().items():
            assert torch.equal(fresh.state_dict()[key], tensor), (name, key)
