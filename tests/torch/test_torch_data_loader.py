"""prepare_data_loader in one process (rank 0 of 1): order, reseeding, resume position."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    RandomSampler,
    SequentialSampler,
    TensorDataset,
    WeightedRandomSampler,
)

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
    # A pass whose iterator is still held is in progress (the state is saved inside the
    # training loop): its position is mid-epoch, and the live loader goes on from there.
    batches = iter(loader)
    seen = [next(batches)[0].tolist(), next(batches)[0].tolist()]
    assert seen == second_epoch[:2]
    position = loader.state_dict()
    assert position == {"epoch": 1, "batch": 2}

    restored = prepare_data_loader(make_loader())
    restored.load_state_dict(position)
    restored.set_epoch(1)  # the DistributedSampler habit keeps the restored position
    assert epoch_batches(restored) == second_epoch[2:]
    assert restored.state_dict() == {"epoch": 2, "batch": 0}
    assert [batch[0].tolist() for batch in batches] == second_epoch[2:]
    assert loader.state_dict() == {"epoch": 2, "batch": 0}


@pytest.mark.parametrize("leave", ["break", "enumerate", "islice", "drop"])
def test_a_pass_left_part_way_resumes_where_the_live_loader_goes_on(leave: str) -> None:
    loader = prepare_data_loader(make_loader())
    epoch_batches(loader)
    if leave == "break":
        for taken, _ in enumerate(loader, 1):
            if taken == 2:
                break
    elif leave == "enumerate":  # the batch that ends the loop is handed out, never used
        for i, _ in enumerate(loader):
            if i == 2:
                break
    elif leave == "islice":
        assert len(list(itertools.islice(loader, 2))) == 2
    else:
        batches = iter(loader)
        next(batches)
        del batches  # the last reference: the iterator is closed
    position = loader.state_dict()
    # The live loader counts the abandoned pass as done, so the saved position does too:
    # a run resumed from it reads the very batches the uninterrupted run reads next.
    assert position == {"epoch": 2, "batch": 0}
    restored = prepare_data_loader(make_loader())
    restored.load_state_dict(position)
    assert epoch_batches(restored) == epoch_batches(loader)
    assert restored.state_dict() == loader.state_dict() == {"epoch": 3, "batch": 0}


def test_an_abandoned_pass_counts_as_done_and_set_epoch_picks_the_next() -> None:
    loader = prepare_data_loader(make_loader())
    held = iter(loader)
    next(held)
    assert loader.state_dict() == {"epoch": 0, "batch": 1}
    # A new pass: the held one counts as done, and this one, released at once, too.
    next(iter(loader))
    assert loader.state_dict() == {"epoch": 2, "batch": 0}
    next(held)  # a stale pass moves nothing, nor does its close
    del held
    assert loader.state_dict() == {"epoch": 2, "batch": 0}
    loader.set_epoch(5)
    assert loader.state_dict() == {"epoch": 5, "batch": 0}
    assert epoch_batches(loader) == epoch_batches(_at_epoch(5))


def _at_epoch(epoch: int) -> PreparedDataLoader:
    loader = prepare_data_loader(make_loader())
    loader.set_epoch(epoch)
    return loader


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("drop_last", [False, True])
def test_a_batch_sampler_is_read_as_its_batch_size_shuffle_and_drop_last(
    shuffle: bool, drop_last: bool,
) -> None:
    dataset = TensorDataset(torch.arange(22))
    sampler = RandomSampler(dataset) if shuffle else SequentialSampler(dataset)
    loader = prepare_data_loader(
        DataLoader(dataset, batch_sampler=BatchSampler(sampler, 4, drop_last)))
    expected = prepare_data_loader(
        DataLoader(dataset, batch_size=4, shuffle=shuffle, drop_last=drop_last))
    assert loader.batch_size == 4
    assert len(loader) == len(expected) == (5 if drop_last else 6)
    first = epoch_batches(loader)
    assert first == epoch_batches(expected)
    assert [len(batch) for batch in first] == [4] * 5 + ([] if drop_last else [2])
    in_order = [list(range(i, min(i + 4, 22))) for i in range(0, 20 if drop_last else 22, 4)]
    assert (first != in_order) if shuffle else (first == in_order)
    assert (epoch_batches(loader) != first) == shuffle  # reseeded every epoch


def test_loaders_a_sampler_cannot_replace_are_refused() -> None:
    dataset = TensorDataset(torch.arange(10))
    weighted = DataLoader(dataset, sampler=WeightedRandomSampler([1.0] * 10, 10))
    with pytest.raises(cairn.ConfigError, match=r"WeightedRandomSampler.*add_dist_sampler=False"):
        prepare_data_loader(weighted)
    kept = prepare_data_loader(weighted, add_dist_sampler=False)
    assert len(kept) == 10
    batched = DataLoader(dataset, batch_sampler=BatchSampler(WeightedRandomSampler([1.0] * 10,
                                                                                 10), 2, False))
    with pytest.raises(cairn.ConfigError, match=r"WeightedRandomSampler.*add_dist_sampler=False"):
        prepare_data_loader(batched)
    with pytest.raises(cairn.ConfigError, match=r"data_loader=\[1, 2\]"):
        prepare_data_loader([1, 2])  # type: ignore[arg-type]
    with pytest.raises(cairn.ConfigError, match="seed=-1"):
        prepare_data_loader(make_loader(), seed=-1)
    with pytest.raises(cairn.ConfigError, match="load_state_dict"):
        prepare_data_loader(make_loader()).load_state_dict({"epoch": 1})


@pytest.mark.parametrize("persistent", [True, False])
def test_persistent_workers_are_named_as_the_limit_of_an_exact_resume(
        caplog: pytest.LogCaptureFixture, persistent: bool) -> None:
    # The same worker processes serve every epoch: their random draws go on from the epoch
    # before, which a restart cannot replay.
    loader = DataLoader(TensorDataset(torch.arange(8)), batch_size=2, num_workers=1,
                        persistent_workers=persistent)
    with caplog.at_level("WARNING", logger="cairn"):
        prepare_data_loader(loader, move_to_device=False)
    warned = [r.getMessage() for r in caplog.records if "persistent_workers" in r.getMessage()]
    if persistent:
        assert warned == [
            "prepare_data_loader: persistent_workers=True keeps the same 1 worker processes "
            "for every epoch, so random draws in them (augmentation) continue from the epoch "
            "before and are not reproduced after a restart; pass persistent_workers=False "
            "for an exact resume"]
    else:
        assert warned == []
