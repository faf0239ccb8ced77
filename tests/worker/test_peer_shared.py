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
from cairn._src.worker import peer_fetch
from cairn._src.worker.memory_copy import MemoryCopies
from cairn._src.worker.peer_fetch import Outcome, fetch_from_peer
from cairn._src.worker.peer_shared import SUFFIX, Offer, open_offered

KEY = b"s" * 32


def entry(data: bytes) -> FileEntry:
    hasher = new_hasher()
    hasher.update(data)
    return FileEntry(len(data), hasher.hexdigest())


def test_the_offered_file_is_written_and_taken_under_its_name(tmp_path: Path) -> None:
    offer = Offer(str(tmp_path), "rank_1/model.pt")
    assert offer.wire[0] == str(tmp_path / "rank_1" / f"model.pt{SUFFIX}")
    file = open_offered(offer.wire)
    assert file is not None
    with file:
        file.write(b"weights")
    assert offer.take(entry(b"weights")) == 7
    assert (tmp_path / "rank_1" / "model.pt").read_bytes() == b"weights"
    assert os.listdir(tmp_path / "rank_1") == ["model.pt"]


def test_a_file_that_is_not_the_manifest_s_is_removed(tmp_path: Path) -> None:
    offer = Offer(str(tmp_path), "model.pt")
    file = open_offered(offer.wire)
    assert file is not None
    with file:
        file.write(b"weighty")  # same size, other bytes
    assert offer.take(entry(b"weights")) is None
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("change", [
    "not a tuple", "strings for numbers", "a bool", "another inode", "holds data",
    "a second link", "a link to it", "a FIFO", "a NUL in the path", "removed",
])
def test_a_peer_writes_nothing_but_the_empty_file_offered(tmp_path: Path, change: str) -> None:
    offer = Offer(str(tmp_path), "model.pt")
    path, device, inode = offer.wire
    wire: Any = offer.wire
    if change == "not a tuple":
        wire = [path, device, inode]
    elif change == "strings for numbers":
        wire = (path, str(device), str(inode))
    elif change == "a bool":
        wire = (path, device, True)
    elif change == "another inode":
        other = tmp_path / "other"
        other.write_bytes(b"")
        wire = (str(other), device, inode)
    elif change == "holds data":
        Path(path).write_bytes(b"the user's data")
    elif change == "a second link":
        os.link(path, tmp_path / "second")
    elif change == "a link to it":
        (tmp_path / "link").symlink_to(path)
        wire = (str(tmp_path / "link"), device, inode)
    elif change == "a FIFO":
        os.mkfifo(tmp_path / "fifo")  # opened, it would block a writer without O_NONBLOCK
        info = os.lstat(tmp_path / "fifo")
        wire = (str(tmp_path / "fifo"), info.st_dev, info.st_ino)
    elif change == "a NUL in the path":
        wire = (path + "\x00", device, inode)
    elif change == "removed":  # the receiver gave up before the peer got to it
        offer.discard()
    assert open_offered(wire) is None
    if change == "holds data":
        assert Path(path).read_bytes() == b"the user's data"
    if change not in ("removed", "holds data", "a second link"):
        assert os.path.getsize(path) == 0


class Writer:
    """A held copy's writer whose one file is written by ``write`` (a sink's)."""

    def __init__(self, write: Any) -> None:
        self.write = write

    def write_file(self, rel: str, sink: Any) -> None:
        self.write(sink)

    def retain(self) -> bool:
        return True

    def close(self) -> None:
        pass


def _fetch(tmp_path: Path, writer: Writer, data: bytes) -> tuple[set[str], Outcome, Path]:
    peer = MemoryCopies(KEY, "127.0.0.1")
    files = {"model.pt": entry(data)}
    peer.hold(2, writer, files)  # type: ignore[arg-type]
    peer.committed(2)
    peer.serve()
    info = peer.info()
    assert info is not None and info.address is not None
    target = tmp_path / "restored"
    target.mkdir()
    outcome = Outcome()
    got = fetch_from_peer(KEY, 0, info.address, 2, files, {"model.pt"}, str(target), outcome)
    return got, outcome, target


def test_a_peer_whose_write_fails_leaves_nothing_and_says_so(tmp_path: Path) -> None:
    def write(sink: Any) -> None:
        sink.write(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    got, outcome, target = _fetch(tmp_path, Writer(write), b"half and more")
    assert got == set() and outcome.peer_bytes == 0
    assert outcome.reasons == ["the transfer from peer rank 0 failed: OSError: the peer "
                               "could not finish writing the file"]
    assert os.listdir(target) == []


def test_a_peer_that_stops_writing_is_given_up_after_the_peer_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(peer_fetch, "PEER_TIMEOUT_S", 0.5)
    release = threading.Event()

    def write(sink: Any) -> None:
        sink.write(b"some")
        release.wait(60)  # a peer that hangs in the middle of the file

    try:
        got, outcome, target = _fetch(tmp_path, Writer(write), b"some more")
    finally:
        release.set()
    assert got == set()
    assert outcome.reasons == ["the transfer from peer rank 0 failed: TimeoutError: no data "
                               "within 0.5s"]
    assert os.listdir(target) == []


def test_a_file_that_keeps_growing_is_waited_for_past_the_peer_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A large file takes longer to write than a peer timeout: the wait is for progress.
    monkeypatch.setattr(peer_fetch, "PEER_TIMEOUT_S", 2.0)
    pieces = [bytes([i]) * 1024 for i in range(12)]
    started = time.monotonic()

    def write(sink: Any) -> None:
        for piece in pieces:
            sink.write(piece)
            time.sleep(0.25)

    got, outcome, target = _fetch(tmp_path, Writer(write), b"".join(pieces))
    assert time.monotonic() - started > 2.0  # longer than one timeout in all
    assert got == {"model.pt"} and outcome.reasons == []
    assert (target / "model.pt").read_bytes() == b"".join(pieces)
