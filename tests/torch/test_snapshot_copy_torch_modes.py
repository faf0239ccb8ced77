"""A snapshot's copy is made in ordinary CPU tensors whatever the caller's torch settings
(its default device, inference mode, grad mode), and meta tensors pass through it."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch import nn

from cairn._src.torch.snapshot_buffers import BufferSet, copy_state
from cairn._src.worker.direct_write import HashingSink
from cairn._src.worker.shared_state import INLINE_BYTES, describe, open_arena, rebuild, serialize

SHARED = [False, pytest.param(True, marks=pytest.mark.skipif(
    not hasattr(os, "memfd_create"), reason="memfd_create"))]


@contextmanager
def default_device(device: str) -> Iterator[None]:
    torch.set_default_device(device)
    try:
        yield
    finally:
        torch.set_default_device(None)


def tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for item in value.values() for t in tensors(item)]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in tensors(item)]
    return []


def round_trip(value: Any) -> Any:
    sink = io.BytesIO()
    serialize(value, sink)
    sink.seek(0)
    return torch.load(sink, weights_only=True)


def entry(value: Any) -> Any:
    sink = HashingSink(None)
    serialize(value, sink)
    return sink.entry()


@pytest.mark.parametrize("shared", SHARED)
def test_the_copy_is_on_the_cpu_whatever_torchs_default_device(shared: bool) -> None:
    flat = torch.arange(8.0, device="cpu")
    state = {"state.pt": {"w": torch.arange(6.0, device="cpu").reshape(2, 3), "flat": flat,
                          "view": flat[2:5], "empty": torch.empty(0, device="cpu"),
                          "step": 3}}
    buffer_set = BufferSet()
    # "meta" stands in for "cuda" here (no GPU needed): a buffer made on the default
    # device would hold no data at all.
    with default_device("meta"):
        copied = copy_state(state, buffer_set, shared=shared)
        if shared:
            assert buffer_set.arena is not None
            described = describe(copied["state.pt"], buffer_set.arena)
            assert described is not None
            mapping = open_arena(buffer_set.arena.wire(), 1 << 30)
            assert mapping is not None
            rebuilt = rebuild(described[0], described[1], mapping)
            assert {t.device.type for t in tensors(rebuilt)} == {"cpu"}
    assert {t.device.type for t in tensors(copied)} == {"cpu"}
    assert {t.device.type for t in buffer_set.tensors.values()} == {"cpu"}
    loaded = round_trip(copied)["state.pt"]
    for name in ("w", "flat", "view", "empty"):
        assert torch.equal(loaded[name], state["state.pt"][name]), name  # type: ignore[arg-type]
    if shared:
        assert entry(rebuilt) == entry(copied["state.pt"])


@pytest.mark.parametrize("shared", SHARED)
def test_a_snapshot_in_inference_mode_leaves_buffers_a_later_snapshot_reuses(
        shared: bool) -> None:
    weight = nn.Parameter(torch.ones(3, 2))
    state = {"state.pt": {"w": weight, "nested": [torch.arange(4)]}}
    buffer_set = BufferSet()
    with torch.inference_mode():
        copy_state(state, buffer_set, shared=shared)
    assert not any(t.is_inference() for t in buffer_set.tensors.values())
    pointers = {path: t.data_ptr() for path, t in buffer_set.tensors.items()}
    with torch.no_grad():
        weight.add_(1.0)
    with torch.enable_grad():
        again = copy_state(state, buffer_set, shared=shared)
    assert {path: t.data_ptr() for path, t in buffer_set.tensors.items()} == pointers
    assert torch.equal(again["state.pt"]["w"], weight.detach())
    assert not again["state.pt"]["w"].requires_grad
    assert again["state.pt"]["w"].grad_fn is None
    # Tensors made in inference mode are copied outside it too.
    with torch.inference_mode():
        made = {"state.pt": {"w": torch.full((3, 2), 5.0), "nested": [torch.arange(4)]}}
    third = copy_state(made, buffer_set, shared=shared)
    assert torch.equal(third["state.pt"]["w"], torch.full((3, 2), 5.0))
    assert not third["state.pt"]["w"].is_inference()


@pytest.mark.parametrize("shared", SHARED)
def test_a_meta_tensor_passes_through_as_it_is(shared: bool) -> None:
    model = nn.Linear(4, 4)
    # Larger than what a shared copy's skeleton may carry, were it data.
    placeholder = torch.empty(INLINE_BYTES // 4 + 1, device="meta")
    model.register_buffer("placeholder", placeholder)
    state = {"model.pt": model.state_dict()}
    buffer_set = BufferSet()
    copied = copy_state(state, buffer_set, shared=shared)
    assert copied["model.pt"]["placeholder"] is state["model.pt"]["placeholder"]
    loaded = round_trip(copied)["model.pt"]
    assert loaded["placeholder"].is_meta and loaded["placeholder"].shape == placeholder.shape
    assert torch.equal(loaded["weight"], model.weight.detach())
    if shared:
        assert buffer_set.arena is not None
        described = describe(copied["model.pt"], buffer_set.arena)
        assert described is not None, "a meta tensor has no bytes to carry"
        mapping = open_arena(buffer_set.arena.wire(), 1 << 30)
        assert mapping is not None
        assert entry(rebuild(described[0], described[1], mapping)) == entry(copied["model.pt"])
