"""The peer a replacement rank's restore reports (keep_survivors, three or more ranks): the
peer whose copy supplied the files the restore used, not the last peer that sent any
file (another rank's small files, fetched beside them). Real sockets on loopback, plain
writers and a snapshot in shared memory, a run directory on local disk."""

from __future__ import annotations

import io
import logging
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from test_memory_copy import KEY, Writer, entry, serving_peer
from test_peer_prefetch import DIR, committed_run

from cairn._src.checkpoint.views import CheckpointView
from cairn._src.storage.retry import DEFAULT_RETRY
from cairn._src.torch.snapshot import _Writer
from cairn._src.torch.snapshot_buffers import BufferSet, copy_state
from cairn._src.wire.messages import RestoredMessage, RestorePlan
from cairn._src.worker.memory_copy import MemoryCopies, RestoreSources
from cairn._src.worker.peer_fetch import Outcome
from cairn._src.worker.peer_prefetch import start_prefetch
from cairn._src.worker.shared_state import serialize

# Rank 2 is replaced: rank 0 holds the shared files and its own small file, rank 1 only
# its own small file (as a kept rank whose copy lacks rank 0's files), the driver rank 2's.
SHARED = {"model.pt": b"weights" * 1000, "progress.pt": b"step 4"}
SMALL = {f"rank_{r}/rank_state.pt": b"rng %d" % r for r in range(3)}


def _replacement(tmp_path: Path, stored: dict[str, bytes],
                 peers: list[tuple[str, int]]) -> tuple[Any, Any, RestoreSources,
                                                         list[object]]:
    """Rank 2's restore sources for report 2 (``stored``, committed) with ``peers`` (ranks
    0, 1, ...) serving it, its own small file from the driver, the prefetch started: the
    run, its manifest, the sources and what they send."""
    run, manifest = committed_run(tmp_path, stored)
    own = "rank_2/rank_state.pt"
    plan = RestorePlan(2, False, tuple((r, *address) for r, address in enumerate(peers)),
                       "a replaced rank; from peer rank 0", {own: stored[own]})
    view = CheckpointView(DIR, 2, run.join(DIR), run.join(DIR), {})
    prefetch = start_prefetch(plan, view, run, KEY, DEFAULT_RETRY, rank=2)
    assert prefetch is not None
    sent: list[object] = []
    sources = RestoreSources(plan=plan, memory=None, run=run, authkey=KEY, rank=2,
                             fallback=None, send=sent.append, prefetch=prefetch)
    return run, manifest, sources, sent


def test_a_directory_restore_names_the_peer_that_sent_most_of_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    _, zero = serving_peer(KEY, {**SHARED, "rank_0/rank_state.pt": SMALL["rank_0/rank_state.pt"]})
    _, one = serving_peer(KEY, {"rank_1/rank_state.pt": SMALL["rank_1/rank_state.pt"]})
    run, manifest, sources, sent = _replacement(tmp_path, {**SHARED, **SMALL}, [zero, one])
    target = tmp_path / "restored"
    target.mkdir()
    with caplog.at_level(logging.INFO, logger="cairn"):
        assert sources.restore(run.join(DIR), manifest, str(target), DEFAULT_RETRY)
    assert {rel: (target / rel).read_bytes() for rel in manifest.files} == {**SHARED, **SMALL}
    [message] = sent
    assert isinstance(message, RestoredMessage)
    assert (message.source, message.storage_bytes) == ("peer+driver", 0)
    # Every file of the directory is used: rank 1's small file counts, and rank 1 with it.
    assert message.peer_rank == 0
    assert message.peer_bytes == sum(map(len, SHARED.values())) + len(b"rng 0rng 1")
    assert (f"from peer+driver (peer rank 0: {message.peer_bytes - 5} bytes, "
            "peer rank 1: 5 bytes)") in caplog.text


def _bytes(value: Any) -> bytes:
    buffer = io.BytesIO()
    serialize(value, buffer)
    return buffer.getvalue()


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="memfd_create")
def test_the_states_used_in_place_name_their_peer_not_the_one_of_another_ranks_file(
    tmp_path: Path,
) -> None:
    # load_training_state's restore: the shared states mapped from rank 0, rank 2's own
    # small state from the driver; rank 1 sent only its own small file, which is not used.
    states = {"model.pt": {"w": torch.arange(4096.0)}, "progress.pt": {"step": 4},
              "rank_0/rank_state.pt": {"rng": 0}}
    stored = {rel: _bytes(value) for rel, value in states.items()}
    stored.update({rel: _bytes({"rng": r}) for r, rel in enumerate(SMALL) if r})
    buffer_set = BufferSet(busy=True)
    copied = copy_state(states, buffer_set, shared=True)
    zero = MemoryCopies(KEY, "127.0.0.1")
    zero.hold(2, _Writer(copied, buffer_set), {rel: entry(stored[rel]) for rel in copied})
    zero.committed(2)
    zero.serve()
    info = zero.info()
    assert info is not None and info.address is not None
    one_file = {"rank_1/rank_state.pt": stored["rank_1/rank_state.pt"]}
    _, one = serving_peer(KEY, one_file, Writer(one_file))
    run, manifest, sources, sent = _replacement(tmp_path, stored, [info.address, one])
    try:
        names = ["model.pt", "progress.pt", "rank_2/rank_state.pt"]
        objects = sources.verified_objects(run.join(DIR), manifest, names,
                                           shared=("model.pt",))
        assert objects is not None and objects["rank_2/rank_state.pt"] == {"rng": 2}
        [message] = sent
        assert isinstance(message, RestoredMessage) and message.prefetched
        assert message.source == "peer+driver" and message.peer_rank == 0
        assert message.peer_bytes == len(stored["model.pt"]) + len(stored["progress.pt"])
    finally:
        sources.close()


def test_of_several_peers_the_one_that_sent_most_bytes_is_named() -> None:
    outcome = Outcome()
    assert (outcome.peer_rank, outcome.peer_bytes) == (None, 0)
    outcome.from_peers["rank_1/rank_state.pt"] = (1, 10)
    outcome.from_peers["model.pt"] = (0, 7)
    outcome.from_peers["optimizer.pt"] = (0, 7)
    assert (outcome.peer_rank, outcome.peer_bytes) == (0, 24)
    assert outcome.described("peer") == "peer (peer rank 1: 10 bytes, peer rank 0: 14 bytes)"
    del outcome.from_peers["optimizer.pt"]  # (not used after all)
    assert outcome.peer_rank == 1  # as many from each: the first to send a file
    assert Outcome(from_peers={"a": (3, 1)}).described("peer") == "peer"
