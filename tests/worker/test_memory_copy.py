"""A kept rank's memory copies (keep_survivors): which snapshot is held, when it is freed,
and what a restore and a peer get from it (real sockets on loopback, a plain writer)."""

from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Listener
from pathlib import Path
from typing import Any

import pytest

from cairn._src.checkpoint.manifest import Manifest
from cairn._src.storage.checksum import FileEntry, new_hasher
from cairn._src.storage.location import resolve
from cairn._src.wire.messages import MemoryCopyInfo, RestoredMessage, RestorePlan
from cairn._src.worker import memory_copy, peer_fetch
from cairn._src.worker.memory_copy import MemoryCopies, RestoreSources
from cairn._src.worker.peer_fetch import PEER_CHUNK, STREAMED, Outcome, fetch_from_peer

KEY = b"k" * 32


class Writer:
    """A deferred checkpoint's writer: the same bytes each time, until closed."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.closed = False
        self.sinks: list[str] = []  # what each file was serialized into

    def names(self) -> list[str]:
        return sorted(self.files)

    def write_file(self, rel: str, sink: Any) -> None:
        self.sinks.append(type(sink).__name__)
        sink.write(self.files[rel])

    def retain(self) -> bool:
        return True

    def close(self) -> None:
        self.closed = True


def entry(data: bytes) -> FileEntry:
    hasher = new_hasher()
    hasher.update(data)
    return FileEntry(len(data), hasher.hexdigest())


def serving_peer(authkey: bytes, files: dict[str, bytes],
                 writer: Writer | None = None) -> tuple[MemoryCopies, tuple[str, int]]:
    """A kept rank holding ``files`` (through ``writer``) as the committed copy of report
    2, serving it on loopback with ``authkey``; it and its address."""
    peer = MemoryCopies(authkey, "127.0.0.1")
    peer.hold(2, writer or Writer(files), {rel: entry(data) for rel, data in files.items()})
    peer.committed(2)
    peer.serve()
    info = peer.info()
    assert info is not None and info.address is not None
    return peer, info.address

def test_a_copy_is_kept_from_its_commit_until_a_later_one_and_freed_after_its_reader() -> None:
    copies = MemoryCopies(KEY, None)
    first, second = Writer({"a": b"1"}), Writer({"a": b"2"})
    assert copies.hold(1, first, {"a": entry(b"1")})
    # Not committed yet: held, and named as such (its commit may complete before the
    # next attempt), but not served as committed.
    assert copies.info() == MemoryCopyInfo(-1, None, (1,)) and copies.acquire(1) is None
    copies.committed(1)
    info = copies.info()
    assert info is not None and info.report_index == 1 and info.address is None
    reading = copies.acquire(1)
    assert reading is not None
    copies.hold(2, second, {"a": entry(b"2")})
    assert copies.info() == MemoryCopyInfo(1, None, (2,))
    copies.committed(2)
    assert not first.closed  # still read
    copies.release(reading)
    assert first.closed and not second.closed
    assert copies.acquire(1) is None
    copies.committed(3)  # a checkpoint this rank holds no copy of
    assert second.closed and copies.info() is None


def test_an_uncommitted_copy_of_a_report_written_again_is_freed() -> None:
    copies = MemoryCopies(KEY, None)
    lost, again = Writer({"a": b"1"}), Writer({"a": b"2"})
    copies.hold(5, lost, {"a": entry(b"1")})  # written, then the attempt failed
    copies.hold(5, again, {"a": entry(b"2")})
    assert lost.closed and not again.closed
    copies.committed(5)
    held = copies.acquire(5)
    assert held is not None and held.writer is again


def _manifest(files: dict[str, bytes], index: int) -> Manifest:
    return Manifest(files={rel: entry(data) for rel, data in files.items()},
                    report_index=index)


STORED = {"model.pt": b"weights" * 1000, "rank_1/rank_state.pt": b"rng"}


def restore_from_peer(tmp_path: Path, driver_files: dict[str, object] | None = None,
                      ) -> tuple[Writer, RestoredMessage]:
    """Rank 1's restore of report 2 (``STORED``, on storage) with a peer serving
    ``model.pt`` and the driver's ``driver_files``, checked to leave ``STORED`` and
    nothing else in its target: the peer's writer and the restore's message."""
    run = resolve(str(tmp_path / "run"))
    directory = tmp_path / "run" / "checkpoint_000002"
    for rel, data in STORED.items():
        (directory / rel).parent.mkdir(parents=True, exist_ok=True)
        (directory / rel).write_bytes(data)
    writer = Writer({"model.pt": STORED["model.pt"]})
    _, address = serving_peer(KEY, writer.files, writer)
    sent: list[object] = []
    sources = RestoreSources(
        plan=RestorePlan(2, False, ((0, *address),), "a replaced rank",
                         driver_files or {}),  # type: ignore[arg-type]
        memory=None, run=run, authkey=KEY, rank=1, fallback=None, send=sent.append)
    target = tmp_path / "restored"
    target.mkdir()
    assert sources.restore(run.join("checkpoint_000002"), _manifest(STORED, 2), str(target),
                           retry=None)  # type: ignore[arg-type]
    assert {p: (target / p).read_bytes() for p in STORED} == STORED
    left = [str(p) for p in target.rglob("*") if p.is_file()]
    assert sorted(left) == sorted(str(target / p) for p in STORED)  # no partial files
    [message] = sent
    assert isinstance(message, RestoredMessage)
    return writer, message


@pytest.mark.parametrize("route", ["same machine", "socket"])
def test_a_replacement_gets_verified_files_from_a_peer_and_the_rest_from_storage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, route: str,
) -> None:
    if route == "socket":  # a peer on another machine: the offered files are not there
        monkeypatch.setattr(memory_copy, "open_offered", lambda offer, gone: None)
    writer, message = restore_from_peer(tmp_path)
    assert (message.source, message.peer_rank) == ("peer+storage", 0)
    assert message.peer_bytes == len(STORED["model.pt"]) and message.storage_bytes == 3
    # Written by the peer into the file offered, or sent over the socket.
    assert writer.sinks == ["HashingSink" if route == "same machine" else "ConnectionSink"]


@pytest.mark.parametrize("kept", [b"rng", b"RNG", "rng"])
def test_a_replacement_takes_its_small_files_from_the_driver_when_they_verify(
    tmp_path: Path, kept: object,
) -> None:
    _, message = restore_from_peer(tmp_path, {"rank_1/rank_state.pt": kept})
    if kept == b"rng":  # the driver's copy is the committed file: nothing from storage
        assert (message.source, message.storage_bytes, message.driver_bytes) == (
            "peer+driver", 0, 3)
        assert message.reason == "a replaced rank"
    else:  # other bytes, or not bytes: storage, and the event log says why
        assert (message.source, message.storage_bytes, message.driver_bytes) == (
            "peer+storage", 3, 0)
        assert ("the driver's copy of 'rank_1/rank_state.pt' does not match the manifest's "
                "checksum") in message.reason


def test_a_peer_with_the_wrong_secret_is_not_used(tmp_path: Path) -> None:
    run = resolve(str(tmp_path / "run"))
    stored = {"model.pt": b"weights"}
    (tmp_path / "run" / "checkpoint_000002").mkdir(parents=True)
    (tmp_path / "run" / "checkpoint_000002" / "model.pt").write_bytes(stored["model.pt"])
    _, address = serving_peer(b"x" * 32, stored)
    sent: list[Any] = []
    sources = RestoreSources(
        plan=RestorePlan(2, False, ((0, *address),), "a replaced rank"), memory=None,
        run=run, authkey=KEY, rank=1, fallback=None, send=sent.append)
    target = tmp_path / "restored"
    target.mkdir()
    # Nothing from the peer: the usual restore (storage) takes over, and says why.
    assert not sources.restore(run.join("checkpoint_000002"), _manifest(stored, 2),
                               str(target), retry=None)  # type: ignore[arg-type]
    assert sent[0].source == "storage" and "peer rank 0" in sent[0].reason


def test_a_peer_that_sends_more_than_a_chunk_at_once_is_not_used(tmp_path: Path) -> None:
    files = {"model.pt": entry(b"weights")}
    listener = Listener(("127.0.0.1", 0), authkey=KEY)

    def misbehave() -> None:
        with listener.accept() as connection:
            connection.recv()
            connection.send(("model.pt",))
            connection.send_bytes(b"w" * (PEER_CHUNK + 1))

    thread = threading.Thread(target=misbehave, daemon=True)
    thread.start()
    outcome = Outcome()
    got = fetch_from_peer(KEY, 0, listener.address, 2, files, {"model.pt"}, str(tmp_path),
                          outcome)
    thread.join(30)
    listener.close()
    assert got == set() and outcome.peer_bytes == 0
    assert outcome.reasons == [
        f"the transfer from peer rank 0 failed: OSError: peer rank 0 sent a message over "
        f"{PEER_CHUNK} bytes, more than a peer sends at once"]
    assert os.listdir(tmp_path) == []  # nothing of the file is left behind


class ValueWriter(Writer):
    """A snapshot's writer that also hands out the held state, and counts serializations."""

    def __init__(self, files: dict[str, bytes]) -> None:
        super().__init__(files)
        self.serialized: list[str] = []

    def write_file(self, rel: str, sink: Any) -> None:
        self.serialized.append(rel)
        super().write_file(rel, sink)

    def value(self, rel: str) -> Any:
        return {"bytes": self.files[rel]}


def test_a_file_just_sent_to_a_peer_is_not_serialized_again_for_the_own_restore(
    tmp_path: Path,
) -> None:
    run = resolve(str(tmp_path / "run"))
    stored = {"model.pt": b"weights" * 1000}
    manifest = _manifest(stored, 2)
    survivor = MemoryCopies(KEY, "127.0.0.1")
    writer = ValueWriter(stored)
    survivor.hold(2, writer, dict(manifest.files))
    survivor.committed(2)
    survivor.serve()
    info = survivor.info()
    assert info is not None and info.address is not None
    replacement = RestoreSources(
        plan=RestorePlan(2, False, ((0, *info.address),), "a replaced rank"), memory=None,
        run=run, authkey=KEY, rank=1, fallback=None, send=lambda _: None)
    target = tmp_path / "restored"
    target.mkdir()
    assert replacement.restore(run.join("checkpoint_000002"), manifest, str(target),
                               retry=None)  # type: ignore[arg-type]
    assert writer.serialized == ["model.pt"]
    sent: list[Any] = []
    own = RestoreSources(plan=RestorePlan(2, True), memory=survivor, run=run, authkey=KEY,
                         rank=0, fallback=None, send=sent.append)
    objects = own.verified_objects(run.join("checkpoint_000002"), manifest, ["model.pt"])
    assert objects == {"model.pt": {"bytes": stored["model.pt"]}}
    # The send hashed what it serialized: checked against the manifest without a second
    # serialization; a later restore serializes again (a send's entry is used once).
    assert writer.serialized == ["model.pt"] and sent[0].source == "memory"
    assert own.verified_objects(run.join("checkpoint_000002"), manifest, ["model.pt"])
    assert writer.serialized == ["model.pt", "model.pt"]


@pytest.mark.skipif(not os.access("/dev/shm", os.W_OK), reason="no writable /dev/shm")
def test_choosing_the_ram_file_system_removes_what_killed_workers_left_there() -> None:
    from cairn._src.storage import scratch
    from cairn._src.worker.memory_copy import SHARED_MEMORY

    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    stale = os.path.join(SHARED_MEMORY, f"{scratch.PREFIX}{scratch._namespace()}-"
                                        f"{process.pid}-test")
    os.makedirs(os.path.join(stale, "sub"))
    with open(os.path.join(stale, "sub", "model.pt"), "wb") as f:
        f.write(b"x" * 4096)
    try:
        assert RestoreSources.scratch_base(1) == SHARED_MEMORY
        assert not os.path.exists(stale)
    finally:
        shutil.rmtree(stale, ignore_errors=True)


def test_a_connection_that_never_authenticates_holds_no_restore_up(tmp_path: Path) -> None:
    files = {"model.pt": b"weights"}
    _, address = serving_peer(KEY, files)
    silent = socket.create_connection(address)  # says nothing, and stays
    try:
        outcome = Outcome()
        done: list[set[str]] = []
        fetch = threading.Thread(target=lambda: done.append(fetch_from_peer(
            KEY, 0, address, 2, {"model.pt": entry(b"weights")}, {"model.pt"},
            str(tmp_path), outcome)), daemon=True)
        fetch.start()
        fetch.join(20)
        assert done == [{"model.pt"}], outcome.reasons
        assert (tmp_path / "model.pt").read_bytes() == b"weights"
    finally:
        silent.close()


def _misbehaving_peer(answer: Any) -> tuple[Listener, threading.Thread]:
    """A peer that authenticates, reads the request, then does ``answer(connection)``."""
    listener = Listener(("127.0.0.1", 0), authkey=KEY)

    def serve() -> None:
        with listener.accept() as connection:
            connection.recv_bytes()
            answer(connection)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, thread


def _fetch_from_misbehaving(answer: Any, target: Path) -> tuple[set[str], Outcome]:
    """Rank 1's fetch of ``model.pt`` (b"weights") from a peer that does ``answer``."""
    listener, thread = _misbehaving_peer(answer)
    outcome = Outcome()
    got = fetch_from_peer(KEY, 0, listener.address, 2, {"model.pt": entry(b"weights")},
                          {"model.pt"}, str(target), outcome)
    thread.join(30)
    listener.close()
    return got, outcome


def test_a_peer_that_stalls_mid_message_is_given_up_for_storage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(peer_fetch, "PEER_TIMEOUT_S", 1.0)
    stalled = threading.Event()

    def stall(connection: Any) -> None:
        connection.send(("model.pt",))
        connection.send_bytes(STREAMED)
        # A message of 100 bytes announced, 10 sent, then nothing.
        os.write(connection.fileno(), struct.pack("!i", 100) + b"w" * 10)
        stalled.wait(30)

    listener, thread = _misbehaving_peer(stall)
    outcome = Outcome()
    done: list[set[str]] = []
    fetch = threading.Thread(target=lambda: done.append(fetch_from_peer(
        KEY, 0, listener.address, 2, {"model.pt": entry(b"w" * 100)}, {"model.pt"},
        str(tmp_path), outcome)), daemon=True)
    fetch.start()
    fetch.join(20)
    stalled.set()
    thread.join(30)
    listener.close()
    assert done == [set()]
    assert "the transfer from peer rank 0 failed" in outcome.reasons[0], outcome.reasons
    assert os.listdir(tmp_path) == []  # nothing left of the file


@pytest.mark.parametrize("case", ["names of the wrong type", "a huge message announced",
                                  "file bytes where the route was due"])
def test_whatever_a_peer_sends_the_restore_falls_back_and_logs_no_checkpoint_bytes(
    tmp_path: Path, case: str
) -> None:
    def answer(connection: Any) -> None:
        if case == "names of the wrong type":
            connection.send((7,))
        elif case == "a huge message announced":
            connection.send(("model.pt",))
            os.write(connection.fileno(), struct.pack("!i", -1) + struct.pack("!Q", 1 << 40))
        else:
            connection.send(("model.pt",))
            connection.send_bytes(b"SECRET-WEIGHTS")

    got, outcome = _fetch_from_misbehaving(answer, tmp_path)
    assert got == set() and outcome.peer_bytes == 0
    [reason] = outcome.reasons
    assert reason.startswith("the transfer from peer rank 0 failed: "), reason
    assert "SECRET" not in reason


def test_a_restore_into_a_directory_with_planted_links_writes_through_none(
    tmp_path: Path
) -> None:
    # to_directory(path) on a replaced rank writes the driver's and peers' files into a
    # directory of the user's, where another user may have planted links.
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"the victim's file")
    target = tmp_path / "restored"
    (target / "rank_1").mkdir(parents=True)
    (target / "rank_1" / "rank_state.pt.cairn-partial").symlink_to(victim)
    (target / "model.pt").symlink_to(victim)
    files = {"model.pt": b"weights", "rank_1/rank_state.pt": b"rng"}
    run = resolve(str(tmp_path / "run"))
    (tmp_path / "run" / "checkpoint_000002").mkdir(parents=True)
    _, address = serving_peer(KEY, {"model.pt": files["model.pt"]})
    sources = RestoreSources(
        plan=RestorePlan(2, False, ((0, *address),), "a replaced rank",
                         {"rank_1/rank_state.pt": b"rng"}),
        memory=None, run=run, authkey=KEY, rank=1, fallback=None, send=lambda m: None)
    assert sources.restore(run.join("checkpoint_000002"), _manifest(files, 2), str(target),
                           retry=None)  # type: ignore[arg-type]
    assert victim.read_bytes() == b"the victim's file"
    for rel, data in files.items():
        assert not (target / rel).is_symlink() and (target / rel).read_bytes() == data


def test_a_checkpoint_naming_a_file_like_a_partial_one_is_restored_whole(
    tmp_path: Path
) -> None:
    # The peer's file first, then the driver's, whose partial file once had that name.
    files = {"a": b"first", "a.cairn-partial": b"second"}
    run = resolve(str(tmp_path / "run"))
    (tmp_path / "run" / "checkpoint_000002").mkdir(parents=True)
    _, address = serving_peer(KEY, {"a.cairn-partial": files["a.cairn-partial"]})
    sources = RestoreSources(
        plan=RestorePlan(2, False, ((0, *address),), "a replaced rank", {"a": b"first"}),
        memory=None, run=run, authkey=KEY, rank=1, fallback=None, send=lambda m: None)
    target = tmp_path / "restored"
    target.mkdir()
    assert sources.restore(run.join("checkpoint_000002"), _manifest(files, 2), str(target),
                           retry=None)  # type: ignore[arg-type]
    assert {p.name: p.read_bytes() for p in target.iterdir()} == files


def test_a_peer_streaming_past_a_file_s_size_is_given_up_at_once(tmp_path: Path) -> None:
    sent = threading.Event()

    def overrun(connection: Any) -> None:
        connection.send(("model.pt",))
        connection.send_bytes(STREAMED)
        try:
            for _ in range(64):  # 512 MiB, for a file of 7 bytes
                connection.send_bytes(b"w" * PEER_CHUNK)
        except OSError:
            sent.set()  # the receiver hung up

    got, outcome = _fetch_from_misbehaving(overrun, tmp_path)
    assert got == set() and sent.is_set()
    assert "peer rank 0 sent more of 'model.pt' than its 7 bytes" in outcome.reasons[0]
    assert os.listdir(tmp_path) == []


class _SlowWriter(Writer):
    """Its first serialization waits for ``release`` (a long transfer to one peer)."""

    def __init__(self, files: dict[str, bytes]) -> None:
        super().__init__(files)
        self.release = threading.Event()
        self.first = True

    def write_file(self, rel: str, sink: Any) -> None:
        if self.first:
            self.first = False
            self.release.wait(30)
        super().write_file(rel, sink)


def _fetch_in_thread(address: tuple[str, int], target: Path,
                     ) -> tuple[threading.Thread, list[set[str]], Outcome]:
    outcome, done = Outcome(), []
    thread = threading.Thread(target=lambda: done.append(fetch_from_peer(
        KEY, 0, address, 2, {"model.pt": entry(b"weights")}, {"model.pt"}, str(target),
        outcome)), daemon=True)
    thread.start()
    return thread, done, outcome


def test_a_peer_serves_a_second_rank_while_a_first_transfer_takes_long(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Served one after the other, the second would wait past the join below.
    monkeypatch.setattr(memory_copy, "open_offered", lambda offer, gone: None)  # the socket
    writer = _SlowWriter({"model.pt": b"weights"})
    _, address = serving_peer(KEY, writer.files, writer)
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    first, first_done, _ = _fetch_in_thread(address, tmp_path / "first")
    while writer.first:  # the first transfer has begun
        time.sleep(0.01)
    second, second_done, outcome = _fetch_in_thread(address, tmp_path / "second")
    second.join(20)
    assert second_done == [{"model.pt"}], outcome.reasons
    writer.release.set()
    first.join(20)
    assert first_done == [{"model.pt"}]


def test_connections_that_never_authenticate_only_delay_a_rank_s_restore(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(memory_copy, "HANDSHAKE_TIMEOUT_S", 1.0)
    _, address = serving_peer(KEY, {"model.pt": b"weights"})
    silent = [socket.create_connection(address) for _ in range(memory_copy.HANDSHAKES + 4)]
    try:
        thread, done, outcome = _fetch_in_thread(address, tmp_path)
        thread.join(20)
        assert done == [{"model.pt"}], outcome.reasons
    finally:
        for connection in silent:
            connection.close()


def test_a_connection_trickling_its_handshake_is_cut_off_at_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A byte every 0.2 s never waits long on any one read: only a deadline for the whole
    # handshake frees its slot.
    monkeypatch.setattr(memory_copy, "HANDSHAKE_TIMEOUT_S", 1.0)
    _, address = serving_peer(KEY, {"model.pt": b"weights"})
    with socket.create_connection(address) as sock:
        sock.settimeout(0.2)
        sock.sendall(struct.pack("!i", 200))  # an answer announced, then sent byte by byte
        started, closed = time.monotonic(), False
        while not closed and time.monotonic() - started < 10:
            try:
                sock.sendall(b"x")
                closed = sock.recv(4096) == b""  # the challenge first, then its end
            except TimeoutError:
                continue
            except OSError:
                closed = True
        assert closed


class _Tier:
    """A node's local tier that holds the checkpoint (``holds``) or not."""

    def __init__(self, holds: bool) -> None:
        self.holds = holds
        self.restores: list[str] = []

    def restore(self, manifest_location: Any, manifest: Any, target: str, retry: Any) -> bool:
        self.restores.append(target)
        return self.holds

    def committed(self, report_index: int) -> None:
        pass


@pytest.mark.parametrize("holds", [True, False])
def test_a_restore_the_local_tier_serves_is_not_reported_as_read_from_storage(
    tmp_path: Path, holds: bool,
) -> None:
    # No memory copy, no peer: the node's local tier may hold the whole checkpoint.
    files = {"model.pt": b"weights", "rank_1/rank_state.pt": b"rng"}
    run = resolve(str(tmp_path / "run"))
    (tmp_path / "run" / "checkpoint_000002").mkdir(parents=True)
    tier = _Tier(holds)
    sent: list[Any] = []
    sources = RestoreSources(plan=RestorePlan(2, False), memory=None, run=run, authkey=KEY,
                             rank=1, fallback=tier, send=sent.append)
    target = str(tmp_path / "restored")
    assert sources.restore(run.join("checkpoint_000002"), _manifest(files, 2), target,
                           retry=None) is holds  # type: ignore[arg-type]
    assert tier.restores == [target]
    [message] = sent
    assert isinstance(message, RestoredMessage) and message.report_index == 2
    assert (message.memory_bytes, message.peer_bytes, message.driver_bytes) == (0, 0, 0)
    if holds:
        assert message.storage_bytes == 0 and "storage" not in message.source
        assert message.source == memory_copy.LOCAL_TIER
    else:  # the caller downloads the checkpoint from storage
        assert message.source == "storage"
        assert message.storage_bytes == sum(len(data) for data in files.values())


def test_no_restore_is_reported_for_objects_the_checkpoint_does_not_hold(
    tmp_path: Path,
) -> None:
    # load_training_state asks for files of another layout: nothing is restored (it
    # raises CheckpointNotFoundError), so nothing is recorded.
    run = resolve(str(tmp_path / "run"))
    stored = {"state.pt": b"state"}
    manifest = _manifest(stored, 2)
    copies = MemoryCopies(KEY, None)
    writer = ValueWriter(stored)
    assert copies.hold(2, writer, dict(manifest.files))
    copies.committed(2)
    sent: list[Any] = []
    own = RestoreSources(plan=RestorePlan(2, True), memory=copies, run=run, authkey=KEY,
                         rank=0, fallback=None, send=sent.append)
    assert own.verified_objects(run.join("checkpoint_000002"), manifest,
                                ["progress.pt", "model.pt"]) is None
    assert sent == [] and writer.serialized == []
    held = copies.acquire(2)  # the copy was given back
    assert held is not None and held.readers == 1
    copies.release(held)
