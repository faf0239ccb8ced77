"""A kept rank's snapshot buffers in shared memory, described by the peer and rebuilt in
place by a replacement (cairn._src.worker.shared_state): what is verified, and what a
description from storage-like untrusted bytes may not make the receiver open or map."""

from __future__ import annotations

import io
import os
from collections import OrderedDict
from typing import Any

import pytest
import torch

from cairn._src.torch import snapshot_buffers
from cairn._src.torch.snapshot_buffers import BufferSet, copy_state
from cairn._src.worker.direct_write import HashingSink
from cairn._src.worker.shared_state import describe, open_arena, rebuild, serialize

pytestmark = pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="memfd_create")


def _state() -> dict[str, Any]:
    model = OrderedDict(w=torch.arange(12.0).reshape(3, 4), b=torch.ones(4, dtype=torch.int64))
    model._metadata = OrderedDict({"": {"version": 1}})  # type: ignore[attr-defined]
    tied = torch.full((5,), 2.0)
    return {"model": model, "tied": [tied, tied], "step": 7, "empty": torch.empty(0),
            "scalar": torch.tensor(3.5)}


def _entry(value: Any) -> Any:
    sink = HashingSink(None)
    serialize(value, sink)
    return sink.entry()


def _copied() -> tuple[Any, BufferSet]:
    buffer_set = BufferSet()
    return copy_state(_state(), buffer_set, shared=True), buffer_set


def _described() -> tuple[Any, Any, bytes, list[Any], Any]:
    """A shared copy of ``_state()``: it, its arena, its skeleton and places, and the
    arena mapped as a peer maps it."""
    copied, buffer_set = _copied()
    arena = buffer_set.arena
    assert arena is not None
    described = describe(copied, arena)
    assert described is not None
    mapping = open_arena(arena.wire(), 1 << 30)
    assert mapping is not None
    return copied, arena, described[0], described[1], mapping


def test_a_shared_copy_lies_in_one_arena_and_serializes_as_a_private_one() -> None:
    copied, buffer_set = _copied()
    assert buffer_set.arena is not None
    assert buffer_set.arena.offset_of(copied["model"]["w"]) is not None
    assert copied["tied"][0] is copied["tied"][1]  # tied weights: one buffer
    assert _entry(copied) == _entry(copy_state(_state(), BufferSet()))
    # The same layout again: the same arena, nothing allocated.
    arena = buffer_set.arena
    copy_state(_state(), buffer_set, shared=True)
    assert buffer_set.arena is arena
    # Another layout: a new arena.
    copy_state({"other": torch.ones(3)}, buffer_set, shared=True)
    assert buffer_set.arena is not arena


def test_a_set_whose_buffers_are_no_longer_shared_forgets_its_arena(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _, buffer_set = _copied()
    monkeypatch.setattr(snapshot_buffers, "allocate", lambda layout: None)  # none to be had
    copy_state({"other": torch.ones(3)}, buffer_set, shared=True)
    assert buffer_set.arena is None and buffer_set.layout == []


def test_a_peer_rebuilds_the_state_in_place_and_it_serializes_to_the_same_bytes() -> None:
    copied, arena, skeleton, placed, mapping = _described()
    assert len(skeleton) < 4096
    value = rebuild(skeleton, placed, mapping)
    assert _entry(value) == _entry(copied)
    assert torch.equal(value["model"]["w"], copied["model"]["w"])
    assert value["tied"][0] is value["tied"][1]
    # The receiver's writes stay its own (a private mapping).
    value["model"]["w"].add_(1.0)
    assert copied["model"]["w"][0, 0].item() == 0.0
    # What the peer changed after describing no longer matches.
    copied["model"]["b"].add_(1)
    changed = rebuild(skeleton, placed, open_arena(arena.wire(), 1 << 30))  # type: ignore[arg-type]
    assert _entry(changed) != _entry(_state())


def test_the_receiver_opens_nothing_but_the_named_file_of_its_user(tmp_path: Any) -> None:
    _, buffer_set = _copied()
    arena = buffer_set.arena
    assert arena is not None
    pid, fd, device, inode, size = arena.wire()
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    fifo_fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    zero_fd = os.open("/dev/zero", os.O_RDONLY)
    plain = tmp_path / "plain"
    plain.write_bytes(b"x" * size)  # a regular file of this user, not sealed
    plain_fd = os.open(plain, os.O_RDONLY)

    def named(descriptor: int) -> tuple[int, int, int, int, int]:
        """The wire of ``descriptor`` itself, so only its type stops it."""
        info = os.fstat(descriptor)
        return (pid, descriptor, info.st_dev, info.st_ino, size)

    try:
        for wire in [
            (pid, fd, device, inode + 1, size),  # another file
            named(fifo_fd),  # a FIFO
            named(zero_fd),  # a device
            named(plain_fd),  # not an arena (its size could change)
            (pid, fd, device, inode, size + 1),  # larger than the file
            (pid, fd, device, inode, 2 << 30),  # beyond the limit
            (pid, fd, device, inode, 0),
            (pid, -1, device, inode, size),
            ("1", fd, device, inode, size),
            (pid, fd, device, inode),
            [pid, fd, device, inode, size],
            (True, fd, device, inode, size),
        ]:
            assert open_arena(wire, 1 << 30) is None, wire
        assert open_arena((pid, fd, device, inode, size), 1 << 30) is not None
    finally:
        for descriptor in (fifo_fd, zero_fd, plain_fd):
            os.close(descriptor)


@pytest.mark.parametrize("change", [
    lambda e: (e[0], e[1] + (1 << 40), *e[2:]),  # beyond the mapping
    lambda e: (*e[:3], "os", *e[4:]),  # not a dtype
    lambda e: (*e[:4], (-1,), *e[5:]),  # a negative size
    lambda e: (*e[:4], (1, 2), (1,), e[6]),  # shape and stride disagree
    lambda e: (e[0] + 100, *e[1:]),  # a tensor the skeleton does not have
    lambda e: e[:6],
])
def test_a_description_that_does_not_fit_is_refused(change: Any) -> None:
    _, _, skeleton, placed, mapping = _described()
    with pytest.raises(ValueError):
        rebuild(skeleton, [change(placed[0]), *placed[1:]], mapping)


def test_a_skeleton_is_loaded_with_tensor_types_only() -> None:
    _, buffer_set = _copied()
    arena = buffer_set.arena
    assert arena is not None
    mapping = open_arena(arena.wire(), 1 << 30)
    assert mapping is not None

    class Planted:
        def __reduce__(self) -> Any:
            return (os.getcwd, ())

    buffer = io.BytesIO()
    torch.save({"x": Planted()}, buffer)
    with pytest.raises(Exception, match=r"Weights only load failed|Unsupported"):
        rebuild(buffer.getvalue(), [], mapping)
