"""The same-machine route of a peer transfer: the peer writes only into the empty file the
receiver offered, and the receiver keeps only what it reads back as the manifest says
(real files, a real peer server on loopback)."""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cairn._src.storage.checksum import FileEntry, new_hasher
from cairn._src.worker import memory_copy, peer_fetch, peer_shared
from cairn._src.worker.memory_copy import MemoryCopies
from cairn._src.worker.peer_fetch import Outcome, fetch_from_peer
from cairn._src.worker.peer_shared import SUFFIX, Offers, open_offered

KEY = b"s" * 32


def entry(data: bytes) -> FileEntry:
    hasher = new_hasher()
    hasher.update(data)
    return FileEntry(len(data), hasher.hexdigest())


def _offer(target: Path, rel: str) -> tuple[Offers, Any]:
    offers = Offers(str(target), [rel])
    return offers, offers.wire()[rel]


def test_the_offered_file_is_written_and_taken_under_its_name(tmp_path: Path) -> None:
    offers, wire = _offer(tmp_path, "rank_1/model.pt")
    # In a directory of the transfer's own: no name of the checkpoint can be an offer's.
    assert Path(wire[0]).parent.parent == tmp_path and wire[0].endswith(SUFFIX)
    file = open_offered(wire)
    assert file is not None
    with file:
        file.write(b"weights")
    assert offers.take("rank_1/model.pt", entry(b"weights")) == 7
    offers.close()
    assert (tmp_path / "rank_1" / "model.pt").read_bytes() == b"weights"
    assert [str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")] == [
        "rank_1", "rank_1/model.pt"]


def test_a_file_that_is_not_the_manifest_s_is_removed(tmp_path: Path) -> None:
    offers, wire = _offer(tmp_path, "model.pt")
    file = open_offered(wire)
    assert file is not None
    with file:
        file.write(b"weighty")  # same size, other bytes
    assert offers.take("model.pt", entry(b"weights")) is None
    offers.close()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("change", [
    "not a tuple", "strings for numbers", "a bool", "another inode", "holds data",
    "a second link", "a link to it", "a FIFO", "a NUL in the path", "removed",
    "another name", "readable by others",
])
def test_a_peer_writes_nothing_but_the_empty_file_offered(tmp_path: Path, change: str) -> None:
    offers, offered = _offer(tmp_path, "model.pt")
    path, device, inode = offered
    wire: Any = offered
    if change == "not a tuple":
        wire = [path, device, inode]
    elif change == "strings for numbers":
        wire = (path, str(device), str(inode))
    elif change == "a bool":
        wire = (path, device, True)
    elif change == "another inode":
        other = Path(path).with_name(f"other{SUFFIX}")
        other.write_bytes(b"")
        wire = (str(other), device, inode)
    elif change == "holds data":
        Path(path).write_bytes(b"the user's data")
    elif change == "a second link":
        os.link(path, tmp_path / "second")
    elif change == "a link to it":
        (tmp_path / f"link{SUFFIX}").symlink_to(path)
        wire = (str(tmp_path / f"link{SUFFIX}"), device, inode)
    elif change == "a FIFO":
        os.mkfifo(tmp_path / f"fifo{SUFFIX}")  # opened, it would block a writer
        info = os.lstat(tmp_path / f"fifo{SUFFIX}")
        wire = (str(tmp_path / f"fifo{SUFFIX}"), info.st_dev, info.st_ino)
    elif change == "a NUL in the path":
        wire = (path + "\x00" + SUFFIX, device, inode)
    elif change == "removed":  # the receiver gave up before the peer got to it
        offers.close()
    elif change == "another name":  # the same empty file, not under an offer's name
        os.rename(path, tmp_path / "marker")
        wire = (str(tmp_path / "marker"), device, inode)
    elif change == "readable by others":
        os.chmod(path, 0o644)
    assert open_offered(wire) is None
    if change == "holds data":
        assert Path(path).read_bytes() == b"the user's data"
    elif change == "another name":
        assert os.path.getsize(tmp_path / "marker") == 0
    elif change not in ("removed", "a second link"):
        assert os.path.getsize(path) == 0


class Writer:
    """A held copy's writer whose files are written by ``write(sink, rel)``."""

    def __init__(self, write: Any) -> None:
        self.write = write

    def write_file(self, rel: str, sink: Any) -> None:
        self.write(sink, rel)

    def retain(self) -> bool:
        return True

    def close(self) -> None:
        pass


def _fetch(tmp_path: Path, writer: Any, files: dict[str, bytes],
           stop: threading.Event | None = None) -> tuple[set[str], Outcome, Path]:
    peer = MemoryCopies(KEY, "127.0.0.1")
    entries = {rel: entry(data) for rel, data in files.items()}
    peer.hold(2, writer, entries)
    peer.committed(2)
    peer.serve()
    info = peer.info()
    assert info is not None and info.address is not None
    target = tmp_path / "restored"
    target.mkdir()
    outcome = Outcome()
    got = fetch_from_peer(KEY, 0, info.address, 2, entries, set(files), str(target),
                          outcome, stop)
    return got, outcome, target


def test_a_peer_whose_write_fails_leaves_nothing_and_says_so(tmp_path: Path) -> None:
    def write(sink: Any, rel: str) -> None:
        sink.write(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    got, outcome, target = _fetch(tmp_path, Writer(write), {"model.pt": b"half and more"})
    assert got == set() and outcome.peer_bytes == 0
    assert outcome.reasons == ["the transfer from peer rank 0 failed: OSError: the peer "
                               "could not finish writing the file"]
    assert os.listdir(target) == []


@pytest.mark.parametrize(("written", "manifest", "timeout_s", "reason"), [
    # A peer that hangs in the middle of the file: given up after the peer timeout.
    (b"some", b"some more", 0.5, "TimeoutError: no data within 0.5s"),
    # A peer that writes past the manifest's size: given up at once, not at the timeout.
    (b"weights and more", b"weights", 30.0,
     "OSError: the peer wrote more of 'model.pt' than its 7 bytes"),
])
def test_a_peer_that_hangs_in_the_middle_of_a_file_is_given_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, written: bytes, manifest: bytes,
    timeout_s: float, reason: str,
) -> None:
    monkeypatch.setattr(peer_fetch, "PEER_TIMEOUT_S", timeout_s)
    release = threading.Event()

    def write(sink: Any, rel: str) -> None:
        sink.write(written)
        release.wait(60)

    try:
        got, outcome, target = _fetch(tmp_path, Writer(write), {"model.pt": manifest})
    finally:
        release.set()
    assert got == set()
    assert outcome.reasons == [f"the transfer from peer rank 0 failed: {reason}"]
    assert os.listdir(target) == []


def test_a_file_that_keeps_growing_is_waited_for_past_the_peer_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A large file takes longer to write than a peer timeout: the wait is for progress.
    monkeypatch.setattr(peer_fetch, "PEER_TIMEOUT_S", 2.0)
    pieces = [bytes([i]) * 1024 for i in range(12)]
    started = time.monotonic()

    def write(sink: Any, rel: str) -> None:
        for piece in pieces:
            sink.write(piece)
            time.sleep(0.25)

    got, outcome, target = _fetch(tmp_path, Writer(write), {"model.pt": b"".join(pieces)})
    assert time.monotonic() - started > 2.0  # longer than one timeout in all
    assert got == {"model.pt"} and outcome.reasons == []
    assert (target / "model.pt").read_bytes() == b"".join(pieces)


@pytest.mark.parametrize("route", ["same machine", "socket"])
def test_no_name_of_the_checkpoint_is_taken_by_an_offer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, route: str,
) -> None:
    if route == "socket":
        monkeypatch.setattr(memory_copy, "open_offered", lambda offer, gone: None)
    files = {"x": b"first", f"x{SUFFIX}": b"second", f"0{SUFFIX}": b"third"}
    got, outcome, target = _fetch(
        tmp_path, Writer(lambda sink, rel: sink.write(files[rel])), files)
    assert got == set(files) and outcome.reasons == []
    assert {p.name: p.read_bytes() for p in target.iterdir()} == files


def test_a_written_file_with_other_bytes_is_not_used(tmp_path: Path) -> None:
    got, outcome, target = _fetch(
        tmp_path, Writer(lambda sink, rel: sink.write(b"weighty")), {"model.pt": b"weights"})
    assert got == set()
    assert outcome.reasons == ["peer rank 0's copy of 'model.pt' does not match the "
                               "manifest's checksum"]
    assert os.listdir(target) == []


def test_a_receiver_that_stops_removes_its_files_and_the_peer_stops_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(peer_shared, "CHECK_BYTES", 1)  # the peer looks at every write
    stop, ended = threading.Event(), threading.Event()
    written: list[int] = []

    def write(sink: Any, rel: str) -> None:
        try:
            for piece in range(1000):
                if piece == 2:
                    stop.set()  # the attempt no longer needs the copy
                sink.write(b"x" * 1024)
                written.append(piece)
                time.sleep(0.01)
        finally:
            ended.set()

    got, outcome, target = _fetch(tmp_path, Writer(write), {"model.pt": b"x" * 1024000},
                                  stop)
    assert got == set()
    assert outcome.reasons == ["the transfer from peer rank 0 failed: OSError: stopped: "
                               "the attempt no longer needs it"]
    assert os.listdir(target) == []
    assert ended.wait(60)
    assert len(written) < 1000  # the peer saw the file gone, and stopped


def test_at_most_max_offers_files_are_offered_the_first_names_given(tmp_path: Path) -> None:
    # Each offer holds a descriptor open for the transfer: a checkpoint of many files
    # must not take them all (the rest are streamed over the socket).
    names = [f"shard_{n:05d}" for n in range(peer_shared.MAX_OFFERS + 50)]
    offers = Offers(str(tmp_path), names)
    try:
        assert sorted(offers.wire()) == names[:peer_shared.MAX_OFFERS]
    finally:
        offers.close()


def test_a_peer_stops_writing_and_frees_the_file_once_its_receiver_is_gone(
    tmp_path: Path,
) -> None:
    # A receiver killed mid-transfer removes nothing; its connection's end says it.
    offers, wire = _offer(tmp_path, "model.pt")
    gone: list[bool] = []
    file = open_offered(wire, gone=lambda: bool(gone))
    assert file is not None
    chunk = b"w" * peer_shared.CHECK_BYTES
    with file:
        file.write(chunk)
        assert os.path.getsize(wire[0]) == len(chunk)
        gone.append(True)
        with pytest.raises(OSError, match="the receiving rank no longer wants the file"):
            file.write(chunk)
    assert os.path.getsize(wire[0]) == 0  # its pages freed at once
    offers.close()
