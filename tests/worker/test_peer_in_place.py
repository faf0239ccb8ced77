"""A replacement rank uses a kept peer's snapshot in place when it lies in shared memory
on the same machine (keep_survivors, cairn._src.worker.peer_mapped): its prefetch maps
and verifies it, ``load_training_state``'s restore takes the states without a file, a
restore that wants files gets them written and verified, and the peer keeps its copy
until the replacement no longer maps it (real sockets on loopback, a real snapshot
writer over shared memory, a run directory on local disk)."""

from __future__ import annotations

import io
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from test_memory_copy import KEY
from test_peer_prefetch import DIR, committed_run

from cairn._src.checkpoint.manifest import Manifest
from cairn._src.checkpoint.views import CheckpointView
from cairn._src.storage.location import StorageLocation
from cairn._src.storage.retry import DEFAULT_RETRY
from cairn._src.torch.snapshot import _Writer
from cairn._src.torch.snapshot_buffers import BufferSet, copy_state
from cairn._src.wire.messages import RestoredMessage, RestorePlan
from cairn._src.worker import memory_copy, peer_mapped
from cairn._src.worker.memory_copy import MemoryCopies, RestoreSources
from cairn._src.worker.peer_prefetch import start_prefetch
from cairn._src.worker.shared_state import serialize

pytestmark = pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="memfd_create")


def _files() -> dict[str, Any]:
    return {"model.pt": {"w": torch.arange(4096.0), "b": torch.ones(3)},
            "progress.pt": {"step": 4}}


def _bytes(value: Any) -> bytes:
    buffer = io.BytesIO()
    serialize(value, buffer)
    return buffer.getvalue()


def _setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[
        StorageLocation, Manifest, MemoryCopies, RestoreSources, list[object]]:
    stored = {rel: _bytes(value) for rel, value in _files().items()}
    stored["rank_1/rank_state.pt"] = _bytes({"rng": 1})
    run, manifest = committed_run(tmp_path, stored)
    # The survivor: its snapshot in shared memory, committed and served.
    buffer_set = BufferSet(busy=True)
    copied = copy_state(_files(), buffer_set, shared=True)
    assert buffer_set.arena is not None
    peer = MemoryCopies(KEY, "127.0.0.1")
    peer.hold(2, _Writer(copied, buffer_set),
              {rel: manifest.files[rel] for rel in copied})
    peer.committed(2)
    peer.serve()
    info = peer.info()
    assert info is not None and info.address is not None

    def no_bytes(*args: Any) -> Any:
        raise AssertionError("the peer's bytes were asked for: the copy was not used in place")

    monkeypatch.setattr(memory_copy, "_send_file", no_bytes)
    plan = RestorePlan(2, False, ((0, *info.address),), "a replaced rank",
                       {"rank_1/rank_state.pt": stored["rank_1/rank_state.pt"]})
    view = CheckpointView(DIR, 2, run.join(DIR), run.join(DIR), {})
    prefetch = start_prefetch(plan, view, run, KEY, DEFAULT_RETRY, rank=1)
    assert prefetch is not None
    sent: list[object] = []
    sources = RestoreSources(plan=plan, memory=None, run=run, authkey=KEY, rank=1,
                             fallback=None, send=sent.append, prefetch=prefetch)
    return run, manifest, peer, sources, sent


def _mapped_readers(copy: Any) -> int:
    """The readers of ``copy`` once the prefetch's ask for the file this peer does not
    hold is over: the server gives the copy back on its own thread after that empty
    answer, which the prefetch does not wait for."""
    deadline = time.monotonic() + 30
    while copy.readers > 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    return int(copy.readers)


def test_the_states_are_used_in_place_verified_and_the_rest_from_the_driver(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run, manifest, _, sources, sent = _setup(tmp_path, monkeypatch)
    names = ["progress.pt", "model.pt", "rank_1/rank_state.pt"]
    objects = sources.verified_objects(run.join(DIR), manifest, names, shared=("model.pt",))
    assert objects is not None
    assert torch.equal(objects["model.pt"]["w"], torch.arange(4096.0))
    assert objects["progress.pt"] == {"step": 4} and objects["rank_1/rank_state.pt"] == {
        "rng": 1}
    [message] = sent
    assert isinstance(message, RestoredMessage) and message.prefetched
    assert (message.source, message.storage_bytes) == ("peer+driver", 0)
    # A restore that wants files gets the same bytes, written and verified.
    target = tmp_path / "restored"
    target.mkdir()
    assert sources.restore(run.join(DIR), manifest, str(target), DEFAULT_RETRY)
    for rel in manifest.files:
        assert (target / rel).read_bytes() == (tmp_path / "run" / DIR / rel).read_bytes()


def test_the_peer_keeps_its_copy_until_the_replacement_no_longer_maps_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run, manifest, peer, sources, _ = _setup(tmp_path, monkeypatch)
    copy = peer._committed
    assert copy is not None
    objects = sources.verified_objects(run.join(DIR), manifest, ["model.pt", "progress.pt"],
                                       shared=("model.pt",))
    assert objects is not None
    peer.committed(3)  # a later checkpoint: the copy goes once nobody reads it
    assert copy.dropped and _mapped_readers(copy) == 1  # the replacement's mapping holds it
    assert copy.writer.names() == ["model.pt", "progress.pt"]  # not freed
    del objects
    sources.close()  # the attempt ends: the prefetch and its mapping go
    deadline = time.monotonic() + 30
    while copy.readers and time.monotonic() < deadline:
        time.sleep(0.01)
    assert copy.readers == 0 and copy.writer.names() == []  # freed


def test_a_forked_child_holding_the_socket_does_not_keep_the_lease(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A DataLoader worker forked while the replacement maps the peer's copy inherits
    # the lease's socket; the lease still ends with the replacement's mapping.
    run, manifest, peer, sources, _ = _setup(tmp_path, monkeypatch)
    copy = peer._committed
    assert copy is not None
    objects = sources.verified_objects(run.join(DIR), manifest, ["model.pt"],
                                       shared=("model.pt",))
    assert objects is not None and _mapped_readers(copy) == 1
    hold, release = os.pipe()
    child = os.fork()
    if child == 0:
        os.read(hold, 1)
        os._exit(0)
    try:
        del objects
        sources.close()
        deadline = time.monotonic() + 30
        while copy.readers and time.monotonic() < deadline:
            time.sleep(0.01)
        assert copy.readers == 0
    finally:
        os.write(release, b"x")
        os.waitpid(child, 0)


@pytest.mark.parametrize("mapping", ["private mapping", "none to be had"])
def test_a_kept_ranks_own_restore_cannot_change_what_a_peer_maps(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mapping: str) -> None:
    run, manifest, peer, sources, _ = _setup(tmp_path, monkeypatch)
    if mapping == "none to be had":  # (a process out of descriptors): a private copy
        monkeypatch.setattr(peer_mapped, "open_arena", lambda wire, limit: None)
    own = RestoreSources(plan=RestorePlan(2, True), memory=peer, run=run, authkey=KEY,
                         rank=0, fallback=None, send=lambda message: None)
    try:
        objects = own.verified_objects(run.join(DIR), manifest, ["model.pt"],
                                       shared=("model.pt",))
        assert objects is not None
        objects["model.pt"]["w"].add_(1.0)  # a load hook that writes what it is given
        held = peer._committed
        assert held is not None
        assert torch.equal(held.writer.value("model.pt")["w"], torch.arange(4096.0))
    finally:
        sources.close()


class _Recorded:
    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.closed = False

    def send_bytes(self, data: bytes) -> None:
        self.sent.append(data)

    def close(self) -> None:
        self.closed = True


def test_a_forked_copy_of_the_release_only_closes_its_socket() -> None:
    # A process forked while the lease is held runs its copy of the finalizer when it
    # ends: that must not end the parent's lease.
    for owner, sent in ((os.getpid(), [b"done"]), (os.getpid() + 1, [])):
        connection = _Recorded()
        peer_mapped._release(connection, owner)  # type: ignore[arg-type]
        assert connection.sent == sent and connection.closed
