"""The CPU buffers in-memory snapshots copy into: reuse, sharing, pool bookkeeping."""

from __future__ import annotations

import io
from collections import OrderedDict, defaultdict

import pytest
import torch
from torch import nn

from cairn._src.torch.snapshot_buffers import SnapshotBuffers, copy_state
from cairn._src.worker import shared_state
from cairn._src.worker.report_handle import ReportHandle


def test_copy_is_independent_and_reuses_buffers_when_shapes_match() -> None:
    pool = SnapshotBuffers()
    weight = torch.randn(4, 3)
    state = {"model.pt": {"w": weight, "step": 3, "groups": [{"lr": 0.1}]}}
    first_set = pool.acquire()
    first = copy_state(state, first_set)
    assert torch.equal(first["model.pt"]["w"], weight)
    assert first["model.pt"]["w"].data_ptr() != weight.data_ptr()
    assert first["model.pt"]["groups"] is not state["model.pt"]["groups"]
    pointer = first["model.pt"]["w"].data_ptr()
    weight.add_(1.0)  # training goes on: the snapshot does not change
    assert not torch.equal(first["model.pt"]["w"], weight)
    pool.release(first_set)

    again = pool.acquire()
    assert again is first_set
    second = copy_state(state, again)
    assert second["model.pt"]["w"].data_ptr() == pointer, "same shape: the buffer is reused"
    assert torch.equal(second["model.pt"]["w"], weight)
    state["model.pt"]["w"] = torch.randn(5, 3)
    third = copy_state(state, again)
    assert third["model.pt"]["w"].shape == (5, 3)
    assert torch.equal(third["model.pt"]["w"], state["model.pt"]["w"])


def test_tied_weights_share_one_copy_and_state_dict_metadata_survives() -> None:
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10, bias=False))
    model[1].weight = model[0].weight
    state_dict = model.state_dict()
    assert isinstance(state_dict, OrderedDict)
    buffer_set = SnapshotBuffers().acquire()
    copied = copy_state(state_dict, buffer_set)
    assert isinstance(copied, OrderedDict)
    assert copied._metadata == state_dict._metadata  # type: ignore[attr-defined]
    assert copied["0.weight"] is copied["1.weight"]
    assert len(buffer_set.tensors) == 1
    assert buffer_set.nbytes == 10 * 4 * 4


def test_busy_sets_are_never_handed_out_and_abandoned_ones_are_dropped() -> None:
    pool = SnapshotBuffers()
    first, second = pool.acquire(), pool.acquire()
    assert first is not second and pool.sets == 2
    refused = ReportHandle(1, has_checkpoint=True)
    pool.track(second, refused)
    refused._resolve(None, RuntimeError("refused before it was written"))
    pool.release(first)
    third = pool.acquire()
    assert third is first
    assert pool.sets == 1, "a busy set whose report is resolved is never released: dropped"
    pool.release(third)
    pool.clear()
    assert pool.sets == 0


def test_serialize_writes_what_torch_load_reads_with_or_without_torchs_zip_parts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state = {"w": torch.arange(10.0), "nested": [torch.ones(2, 3), 7], "step": 3}
    found = shared_state._zip_writer_parts()
    assert found is not None  # this torch: the CRC-free writer
    for parts in (found, None):
        monkeypatch.setattr(shared_state, "_zip_writer_parts", lambda parts=parts: parts)
        sink = io.BytesIO()
        shared_state.serialize(state, sink)
        loaded = torch.load(io.BytesIO(sink.getvalue()))
        assert torch.equal(loaded["w"], state["w"]) and loaded["step"] == 3
        assert torch.equal(loaded["nested"][0], torch.ones(2, 3)) and loaded["nested"][1] == 7


def test_a_conjugate_or_negative_view_is_not_taken_for_the_tensor_it_views() -> None:
    # z.conj() shares z's storage, offset and strides: as a tied weight it was stored as z.
    z, x = torch.randn(3, dtype=torch.complex64), torch.randn(3)
    state = {"z": z, "zc": z.conj(), "x": x, "xn": torch._neg_view(x), "tied": z}
    copied = copy_state(state, SnapshotBuffers().acquire())
    assert torch.equal(copied["z"], z) and torch.equal(copied["x"], x)
    assert torch.equal(copied["zc"].resolve_conj(), z.conj().resolve_conj())
    assert torch.equal(copied["xn"].resolve_neg(), -x)
    assert copied["tied"].data_ptr() == copied["z"].data_ptr()  # tied weights still share


def test_a_nested_tensor_is_copied() -> None:
    nested = torch.nested.nested_tensor([torch.randn(2), torch.randn(3)])
    copied = copy_state({"nt": nested}, SnapshotBuffers().acquire())["nt"]
    assert copied.is_nested
    assert all(torch.equal(a, b) for a, b in zip(copied.unbind(), nested.unbind(), strict=True))


def test_a_defaultdict_keeps_its_type_and_factory() -> None:
    history = defaultdict(list, {"a": [torch.ones(1)]})
    copied = copy_state({"history": history}, SnapshotBuffers().acquire())["history"]
    assert type(copied) is defaultdict and copied.default_factory is list
    copied["b"].append(1)  # as the live one would
