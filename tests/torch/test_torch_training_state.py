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
    next(iter(loader))
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
