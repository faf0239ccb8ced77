"""prepare_data_loader in one process (rank 0 of 1): order, reseeding, resume position."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset, WeightedRandomSampler

import cairn
from cairn.torch import PreparedDataLoader, prepare_data_loader


def make_loader(shuffle: bool = True, size: int = 20, batch_size: int = 4) -> DataLoader:
    dataset = TensorDataset(torch.arange(size))
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle)


def epoch_batches(loader: PreparedDataLoader) -> list[list[int]]:
    return [batch[0].tolist() for batch in loader]


def test_shuffle_is_kept_and_every_epoch_is_reseeded() -> None:
    loader = prepare_data_loader(make_loader(shuffle=True))
    first, second = epoch_batches(loader), epoch_batches(loader)
    assert sorted(i for batch in first for i in batch) == list(range(20))
    assert first != second, "each pass must be a new epoch with a new order"
    assert first != [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15],
                     [16, 17, 18, 19]]
    assert loader.epoch == 2
    again = prepare_data_loader(make_loader(shuffle=True))
    assert epoch_batches(again) == first, "the order is a function of seed and epoch only"
    other_seed = prepare_data_loader(make_loader(shuffle=True), seed=7)
    assert epoch_batches(other_seed) != first


def test_sequential_loader_stays_in_order() -> None:
    loader = prepare_data_loader(make_loader(shuffle=False))
    assert [i for batch in epoch_batches(loader) for i in batch] == list(range(20))
    assert len(loader) == 5
    assert loader.batch_size == 4  # other attributes are the wrapped loader's


def test_iterating_does_not_draw_from_the_global_torch_rng() -> None:
    loader = prepare_data_loader(make_loader(shuffle=True))
    torch.manual_seed(3)
    expected = torch.rand(3)
    torch.manual_seed(3)
    epoch_batches(loader)
    assert torch.equal(torch.rand(3), expected)


def test_a_restored_position_continues_mid_epoch() -> None:
    reference = prepare_data_loader(make_loader())
    epoch_batches(reference)
    second_epoch = epoch_batches(reference)

    loader = prepare_data_loader(make_loader())
    epoch_batches(loader)
    seen = []
    for batch in loader:
        seen.append(batch[0].tolist())
        if len(seen) == 2:
            break
    position = loader.state_dict()
    assert position == {"epoch": 1, "batch": 2}

    restored = prepare_data_loader(make_loader())
    restored.load_state_dict(position)
    restored.set_epoch(1)  # the DistributedSampler habit keeps the restored position
    assert epoch_batches(restored) == second_epoch[2:]
    assert restored.state_dict() == {"epoch": 2, "batch": 0}


def test_an_abandoned_pass_counts_as_done_and_set_epoch_picks_the_next() -> None:
    loader = prepare_data_loader(make_loader())
    next(iter(loader))
    assert loader.state_dict() == {"epoch": 0, "batch": 1}
    next(iter(loader))
    assert loader.state_dict() == {"epoch": 1, "batch": 1}
    loader.set_epoch(5)
    assert loader.state_dict() == {"epoch": 5, "batch": 0}
    assert epoch_batches(loader) == epoch_batches(_at_epoch(5))


def _at_epoch(epoch: int) -> PreparedDataLoader:
    loader = prepare_data_loader(make_loader())
    loader.set_epoch(epoch)
    return loader


def test_loaders_a_sampler_cannot_replace_are_refused() -> None:
    dataset = TensorDataset(torch.arange(10))
    weighted = DataLoader(dataset, sampler=WeightedRandomSampler([1.0] * 10, 10))
    with pytest.raises(cairn.ConfigError, match=r"WeightedRandomSampler.*add_dist_sampler=False"):
        prepare_data_loader(weighted)
    kept = prepare_data_loader(weighted, add_dist_sampler=False)
    assert len(kept) == 10
    with pytest.raises(cairn.ConfigError, match=r"data_loader=\[1, 2\]"):
        prepare_data_loader([1, 2])  # type: ignore[arg-type]
    with pytest.raises(cairn.ConfigError, match="seed=-1"):
        prepare_data_loader(make_loader(), seed=-1)
    with pytest.raises(cairn.ConfigError, match="load_state_dict"):
        prepare_data_loader(make_loader()).load_state_dict({"epoch": 1})
