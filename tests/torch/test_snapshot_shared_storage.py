"""Tensors that share a storage keep sharing it in a snapshot, as ``torch.save`` keeps
them: a flat buffer and its views come back linked, a broadcast view stays the size of
its storage, and a kept rank's shared copy is rebuilt by a peer with the same links."""

from __future__ import annotations

import copy
import io
import os
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import torch

from cairn._src.torch.snapshot_buffers import BufferSet, copy_state
from cairn._src.worker.direct_write import HashingSink
from cairn._src.worker.shared_state import describe, open_arena, rebuild, serialize


def state() -> dict[str, Any]:
    flat = torch.arange(8.0)  # a flat parameter buffer and the views of it
    return {"flat": flat, "w": flat[:6].view(2, 3), "w_t": flat[:6].view(2, 3).t(),
            "b": flat[6:], "mask": torch.ones(1000).expand(50_000, 1000), "step": 4}


def serialized(value: Any) -> bytes:
    sink = io.BytesIO()
    serialize(value, sink)
    return sink.getvalue()


def entry(value: Any) -> Any:
    sink = HashingSink(None)
    serialize(value, sink)
    return sink.entry()


def assert_linked(value: dict[str, Any]) -> None:
    """An update through the flat buffer shows in each of its views."""
    value["flat"].add_(100.0)
    assert value["w"][0, 0].item() == 100.0
    assert value["w_t"][1, 0].item() == 101.0
    assert value["b"][0].item() == 106.0


def test_views_of_one_storage_are_copied_once_and_come_back_linked() -> None:
    original = state()
    buffer_set = BufferSet()
    copied = copy_state({"state.pt": original}, buffer_set)["state.pt"]
    for name in ("flat", "w", "w_t", "b", "mask"):
        assert torch.equal(copied[name], original[name]), name
        assert copied[name].stride() == original[name].stride(), name
    # One buffer per storage: the flat buffer's 8 floats and the broadcast view's 1,000.
    assert buffer_set.nbytes == (8 + 1000) * 4
    assert len(serialized(copied)) < 3 * len(serialized(original))
    assert len(serialized(copied)) < 64 * 1024  # (the mask alone is 190 MiB dense)
    original["flat"].add_(1.0)  # training goes on: the copy does not change
    assert copied["w"][0, 0].item() == 0.0
    loaded = torch.load(io.BytesIO(serialized(copied)), weights_only=True)
    assert loaded["mask"].shape == (50_000, 1000) and loaded["mask"].stride() == (0, 1)
    assert_linked(loaded)
    assert_linked(copy.deepcopy(copied))  # a kept rank's own restore deep-copies


def test_only_the_part_of_a_storage_that_the_state_views_is_copied_and_reused() -> None:
    big = torch.arange(1000.0)
    files = {"state.pt": {"a": big[10:20], "b": big[15:30].view(3, 5)}}
    buffer_set = BufferSet()
    copied = copy_state(files, buffer_set)["state.pt"]
    assert buffer_set.nbytes == 20 * 4
    assert copied["a"].untyped_storage().data_ptr() == copied["b"].untyped_storage().data_ptr()
    assert torch.equal(copied["a"], big[10:20]) and torch.equal(copied["b"], big[15:30].view(3, 5))
    pointer = copied["a"].untyped_storage().data_ptr()
    big.mul_(2.0)
    again = copy_state(files, buffer_set)["state.pt"]
    assert again["a"].untyped_storage().data_ptr() == pointer, "the same range: reused"
    assert torch.equal(again["b"], big[15:30].view(3, 5))
    files["state.pt"]["c"] = big[40:45]  # the range grows: a new buffer, still one
    third = copy_state(files, buffer_set)["state.pt"]
    assert buffer_set.nbytes == 35 * 4 and len(buffer_set.tensors) == 1
    assert torch.equal(third["c"], big[40:45]) and torch.equal(third["a"], big[10:20])


def test_views_in_another_dtype_or_conjugated_are_copied_apart() -> None:
    x = torch.arange(4.0)
    z = torch.randn(3, dtype=torch.complex64)
    # torch.save refuses one storage viewed as two dtypes: the copy gives each dtype a
    # buffer of its own, and a conjugate view its value, dense.
    files = {"state.pt": {"x": x, "bits": x.view(torch.int32), "z": z, "z_conj": z.conj(),
                          "real": torch.view_as_real(z)}}
    copied = copy_state(files, BufferSet())
    loaded = torch.load(io.BytesIO(serialized(copied)), weights_only=True)["state.pt"]
    for name, value in files["state.pt"].items():
        assert torch.equal(loaded[name], value), name


def test_a_lone_strided_view_keeps_its_strides_and_parameters_are_copied_detached() -> None:
    weight = torch.nn.Parameter(torch.randn(3, 4))
    files = {"state.pt": {"t": torch.randn(3, 4).t(), "every_other": torch.arange(10.0)[::2],
                          "weight": weight, "scalar": torch.tensor(2.5)}}
    buffer_set = BufferSet()
    copied = copy_state(files, buffer_set)["state.pt"]
    assert copied["t"].stride() == (1, 4) and torch.equal(copied["t"], files["state.pt"]["t"])
    assert torch.equal(copied["every_other"], torch.arange(0.0, 10.0, 2.0))
    assert type(copied["weight"]) is torch.Tensor and not copied["weight"].requires_grad
    assert torch.equal(copied["weight"], weight.detach())
    assert copied["scalar"].shape == () and copied["scalar"].item() == 2.5
    assert buffer_set.nbytes == (12 + 9 + 12 + 1) * 4


class Reordering(Mapping[str, Any]):
    """A mapping that gives its items in another order each time it is read."""

    def __init__(self, items: dict[str, Any]) -> None:
        self._items = items
        self._reads = 0

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[str]:
        self._reads += 1
        keys = list(self._items)
        return iter(keys if self._reads % 2 else keys[::-1])


def test_a_state_that_changes_while_it_is_copied_is_refused() -> None:
    state = {"state.pt": Reordering({"a": torch.zeros(2), "b": torch.ones(2)})}
    with pytest.raises(RuntimeError, match=r"the state changed while it was copied"):
        copy_state(state, BufferSet())


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="memfd_create")
def test_a_peer_rebuilds_a_shared_copy_with_its_views_over_one_storage() -> None:
    buffer_set = BufferSet()
    copied = copy_state({"state.pt": state()}, buffer_set, shared=True)["state.pt"]
    arena = buffer_set.arena
    assert arena is not None and len(buffer_set.layout) == 2
    assert arena.size < 64 * 1024
    described = describe(copied, arena)
    assert described is not None
    mapping = open_arena(arena.wire(), 1 << 30)
    assert mapping is not None
    value = rebuild(described[0], described[1], mapping)
    assert entry(value) == entry(copied), "serialized again: the bytes the peer wrote"
    assert_linked(value)
    assert copied["flat"][0].item() == 0.0  # (the peer's memory is not written)
