"""prepare_data_loader and the epoch the user picks: Ray Train's
``loader.sampler.set_epoch(epoch)``, a DistributedSampler of the user's (its seed kept),
a loader kept with ``add_dist_sampler=False`` (resumed exactly), and argument checks.

The runs are real: TorchTrainer with two gloo workers on the CPU, one of them killed with
SIGKILL in the middle of an epoch, and each epoch's order compared with a run without a
failure and with what a DistributedSampler of that epoch gives.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import cairn
from cairn import FailureConfig, ScalingConfig
from cairn.torch import (
    TorchTrainer,
    load_training_state,
    prepare_data_loader,
    save_training_state,
)

RunConfigFactory = Callable[..., cairn.RunConfig]
EPOCHS = 4
KILLED_EPOCH = 2


def _log(config: dict[str, Any], rank: int, row: dict[str, Any]) -> None:
    with open(os.path.join(config["scratch"], f"rank_{rank}.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")


def _rows(scratch: str, rank: int) -> list[dict[str, Any]]:
    with open(os.path.join(scratch, f"rank_{rank}.jsonl")) as f:
        return [json.loads(line) for line in f]


# --- workloads (run in the worker processes) ---------------------------------------------


def explicit_epochs(config: dict[str, Any]) -> None:
    """A Ray Train script ported by its imports: it resumes from its own ``torch.save``
    checkpoint ({"epoch"}) and picks each epoch with ``set_epoch``, on ``loader.sampler``
    (Ray's idiom) or on the DistributedSampler it built (``config["idiom"]``). Rank 1 is
    SIGKILLed after the first batch of epoch 2 on the first attempt (``config["kill"]``)."""
    context = cairn.get_context()
    rank, attempt = context.get_world_rank(), context.get_attempt()
    dataset = TensorDataset(torch.arange(config["size"]))
    own_sampler = None
    if config["idiom"] == "users_sampler":
        own_sampler = DistributedSampler(dataset, shuffle=True, seed=42, drop_last=True)
        loader = prepare_data_loader(DataLoader(dataset, batch_size=2, sampler=own_sampler))
    else:
        loader = prepare_data_loader(DataLoader(dataset, batch_size=2, shuffle=True))
    start = 0
    checkpoint = cairn.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            start = torch.load(os.path.join(directory, "state.pt"))["epoch"] + 1
    for epoch in range(start, EPOCHS):
        if own_sampler is not None:
            own_sampler.set_epoch(epoch)
        else:
            loader.sampler.set_epoch(epoch)
        order: list[int] = []
        for (batch,) in loader:
            order += batch.tolist()
            if config["kill"] and attempt == 0 and rank == 1 and epoch == KILLED_EPOCH:
                os.kill(os.getpid(), signal.SIGKILL)
        _log(config, rank, {"attempt": attempt, "epoch": epoch, "order": order})
        with tempfile.TemporaryDirectory() as directory:
            if rank == 0:
                torch.save({"epoch": epoch}, os.path.join(directory, "state.pt"))
            cairn.report({"epoch": epoch}, checkpoint=(
                cairn.Checkpoint.from_directory(directory) if rank == 0 else None))


def kept_loader_resumed(config: dict[str, Any]) -> list[float]:
    """A loader kept as it is (``add_dist_sampler=False``, ``shuffle=True``), its position
    saved with the training state every 3 steps; every step logs its batch and a draw from
    the global torch RNG. Rank 1 is SIGKILLed at step 8 (mid-epoch) on the first attempt
    (``config["kill"]``)."""
    context = cairn.get_context()
    rank, attempt = context.get_world_rank(), context.get_attempt()
    torch.manual_seed(0)
    model = nn.Linear(1, 1)
    loader = prepare_data_loader(
        DataLoader(TensorDataset(torch.arange(20)), batch_size=4, shuffle=True),
        add_dist_sampler=False)
    step = 0
    checkpoint = cairn.get_checkpoint()
    if checkpoint is not None:
        step = load_training_state(checkpoint, model=model, data_loader=loader).step
    for epoch in range(loader.epoch, 3):
        for (batch,) in loader:
            step += 1
            _log(config, rank, {"attempt": attempt, "step": step, "epoch": epoch,
                                "batch": batch.tolist(), "draw": float(torch.rand(1))})
            if step % 3 == 0:
                with tempfile.TemporaryDirectory() as directory:
                    save_training_state(directory, model=model, data_loader=loader,
                                        step=step)
                    cairn.report({"step": step},
                                 checkpoint=cairn.Checkpoint.from_directory(directory))
            if config["kill"] and attempt == 0 and rank == 1 and step == 8:
                os.kill(os.getpid(), signal.SIGKILL)
    return torch.rand(2).tolist()


# --- driver side -------------------------------------------------------------------------


def _fit(train: Callable[[dict[str, Any]], Any], run_config: RunConfigFactory,
         scratch: str, name: str, *, killed: bool, **config: Any) -> cairn.Result:
    directory = os.path.join(scratch, name)
    os.makedirs(directory)
    result = TorchTrainer(
        train,
        train_loop_config={**config, "scratch": directory, "kill": killed},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=run_config(name=name, failure_config=FailureConfig(max_failures=1)),
    ).fit()
    assert result.goodput.failures == (1 if killed else 0)
    return result


def _last_attempts(rows: list[dict[str, Any]], key: str) -> dict[int, dict[str, Any]]:
    """The rows of the run's final trajectory: for each ``key``, the last attempt's."""
    return {row[key]: row for row in rows}


def _sampler_order(size: int, rank: int, epoch: int, **settings: Any) -> list[int]:
    sampler = DistributedSampler(TensorDataset(torch.arange(size)), num_replicas=2,
                                 rank=rank, shuffle=True, **settings)
    sampler.set_epoch(epoch)
    return list(sampler)


@pytest.mark.parametrize("idiom", ["loader.sampler", "users_sampler"])
def test_an_explicit_set_epoch_picks_the_order_also_after_a_kill_9(
    run_config: RunConfigFactory, scratch: str, idiom: str,
) -> None:
    # 15 samples: with the user's sampler (drop_last=True) 7 per rank, else 8 (padded).
    size = 15
    _fit(explicit_epochs, run_config, scratch, "uninterrupted", killed=False,
         idiom=idiom, size=size)
    _fit(explicit_epochs, run_config, scratch, "killed", killed=True, idiom=idiom,
         size=size)
    settings = {"seed": 42, "drop_last": True} if idiom == "users_sampler" else {}
    for rank in (0, 1):
        reference = _last_attempts(_rows(os.path.join(scratch, "uninterrupted"), rank),
                                   "epoch")
        resumed = _last_attempts(_rows(os.path.join(scratch, "killed"), rank), "epoch")
        assert sorted(resumed) == sorted(reference) == list(range(EPOCHS))
        # The resumed attempt ran the epochs from the killed one on.
        assert [resumed[e]["attempt"] for e in range(EPOCHS)] == [0, 0, 1, 1]
        for epoch in range(EPOCHS):
            expected = _sampler_order(size, rank, epoch, **settings)
            assert resumed[epoch]["order"] == reference[epoch]["order"] == expected, (
                rank, epoch)
        assert len({tuple(row["order"]) for row in reference.values()}) == EPOCHS


def test_a_kept_shuffled_loader_resumes_exactly_after_a_kill_9(
    run_config: RunConfigFactory, scratch: str,
) -> None:
    reference = _fit(kept_loader_resumed, run_config, scratch, "uninterrupted",
                     killed=False)
    killed = _fit(kept_loader_resumed, run_config, scratch, "killed", killed=True)
    for rank in (0, 1):
        expected = _last_attempts(_rows(os.path.join(scratch, "uninterrupted"), rank),
                                  "step")
        resumed = _last_attempts(_rows(os.path.join(scratch, "killed"), rank), "step")
        assert sorted(resumed) == sorted(expected) == list(range(1, 16))
        # Steps 7 to 15 ran again after the restore from step 6 (epoch 1, batch 1).
        assert [resumed[s]["attempt"] for s in range(1, 16)] == [0] * 6 + [1] * 9
        for step in range(1, 16):
            for key in ("epoch", "batch", "draw"):
                assert resumed[step][key] == expected[step][key], (rank, step, key)
    assert killed.return_value == reference.return_value


# --- in one process (rank 0 of 1) --------------------------------------------------------


def _order(loader: Any) -> list[int]:
    return [i for (batch,) in loader for i in batch.tolist()]


def _one_rank_order(size: int, epoch: int, **settings: Any) -> list[int]:
    sampler = DistributedSampler(TensorDataset(torch.arange(size)), num_replicas=1, rank=0,
                                 **settings)
    sampler.set_epoch(epoch)
    return list(sampler)


def _shuffled(size: int = 8, batch_size: int = 2) -> DataLoader[Any]:
    return DataLoader(TensorDataset(torch.arange(size)), batch_size=batch_size, shuffle=True)


def test_a_loader_prepared_every_epoch_takes_the_epoch_set_on_its_sampler() -> None:
    for epoch in range(3):
        loader = prepare_data_loader(_shuffled())
        loader.sampler.set_epoch(epoch)
        assert loader.epoch == epoch
        assert _order(loader) == _one_rank_order(8, epoch, shuffle=True)
        assert loader.sampler.epoch == epoch
        assert loader.state_dict() == {"epoch": epoch + 1, "batch": 0}
    # The passes after an explicit epoch count on from it.
    loader = prepare_data_loader(_shuffled())
    loader.sampler.set_epoch(5)
    _order(loader)
    assert _order(loader) == _one_rank_order(8, 6, shuffle=True)


def test_an_explicit_set_epoch_wins_over_a_restored_position_of_another_epoch() -> None:
    loader = prepare_data_loader(_shuffled())
    loader.load_state_dict({"epoch": 2, "batch": 1})
    loader.sampler.set_epoch(2)  # the epoch of the position: the position is kept
    assert loader.state_dict() == {"epoch": 2, "batch": 1}
    assert _order(loader) == _one_rank_order(8, 2, shuffle=True)[2:]
    loader.load_state_dict({"epoch": 2, "batch": 1})
    loader.sampler.set_epoch(3)
    assert loader.state_dict() == {"epoch": 3, "batch": 0}
    assert _order(loader) == _one_rank_order(8, 3, shuffle=True)


def test_a_set_epoch_while_a_pass_is_held_makes_that_the_next_pass() -> None:
    loader = prepare_data_loader(_shuffled())
    held = iter(loader)
    next(held)
    loader.sampler.set_epoch(4)
    next(held)  # the held pass no longer moves the position
    assert loader.state_dict() == {"epoch": 4, "batch": 0}
    assert _order(loader) == _one_rank_order(8, 4, shuffle=True)


def test_a_users_distributed_sampler_keeps_its_settings_and_its_set_epoch() -> None:
    dataset = TensorDataset(torch.arange(10))
    own = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=42,
                             drop_last=True)
    loader = prepare_data_loader(DataLoader(dataset, sampler=own, batch_size=10))
    assert (loader.sampler.seed, loader.sampler.shuffle, loader.sampler.drop_last) == (
        42, True, True)
    assert _order(loader) == list(own) == _one_rank_order(10, 0, shuffle=True, seed=42)
    own.set_epoch(7)  # on the user's own object, which the loader reads a copy of
    assert loader.epoch == 7
    assert _order(loader) == _one_rank_order(10, 7, shuffle=True, seed=42)
    assert _order(loader) == _one_rank_order(10, 8, shuffle=True, seed=42)

    # Kept as it is (add_dist_sampler=False), the user's set_epoch is not overridden either.
    own = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=42)
    kept = prepare_data_loader(DataLoader(dataset, sampler=own, batch_size=10),
                               add_dist_sampler=False)
    own.set_epoch(3)
    assert _order(kept) == _one_rank_order(10, 3, shuffle=True, seed=42)
    assert _order(kept) == _one_rank_order(10, 4, shuffle=True, seed=42)
    assert own.epoch == 4

    class Mine(DistributedSampler):  # type: ignore[type-arg]
        pass

    mine = Mine(dataset, num_replicas=1, rank=0)
    with pytest.raises(cairn.ConfigError, match=r"sampler Mine.*add_dist_sampler=False"):
        prepare_data_loader(DataLoader(dataset, sampler=mine))


def test_a_kept_loader_draws_nothing_from_the_global_rng_and_resumes_mid_epoch() -> None:
    def kept() -> Any:
        return prepare_data_loader(_shuffled(12), add_dist_sampler=False)

    reference = kept()
    torch.manual_seed(3)
    expected_draw = torch.rand(2)
    torch.manual_seed(3)
    first, second = _order(reference), _order(reference)
    assert torch.equal(torch.rand(2), expected_draw)
    assert sorted(first) == list(range(12)) and first != second
    assert _order(kept()) == first, "the order is a function of seed and epoch"
    restored = kept()
    restored.load_state_dict({"epoch": 1, "batch": 2})
    assert _order(restored) == second[4:]


def test_arguments_of_the_wrong_type_are_refused() -> None:
    with pytest.raises(cairn.ConfigError,
                       match=r"prepare_data_loader\(add_dist_sampler='no'\) must be True or "
                             "False"):
        prepare_data_loader(_shuffled(), add_dist_sampler="no")  # type: ignore[arg-type]
    with pytest.raises(cairn.ConfigError,
                       match=r"prepare_data_loader\(move_to_device='cuda'\) must be True or "
                             "False"):
        prepare_data_loader(_shuffled(), move_to_device="cuda")  # type: ignore[arg-type]
    loader = prepare_data_loader(_shuffled())
    with pytest.raises(cairn.ConfigError, match=r"set_epoch\(epoch=-1\) must be an integer"):
        loader.sampler.set_epoch(-1)
