"""The receiving end of a peer transfer (``keep_survivors``): ask a surviving rank's
``PeerServer`` (:mod:`.memory_copy`) for files of a committed checkpoint and write each
one under a directory, hashed as it arrives, kept only when its size and checksum are the
manifest's. A peer on the same machine writes the files itself, into empty files this
side offers (:mod:`.peer_shared`), which are then hashed here the same way. Used by a
restore (``RestoreSources``) and by a replacement rank's prefetch (:mod:`.peer_prefetch`);
each call owns its connection."""

from __future__ import annotations

import errno
import functools
import os
import pickle
import shutil
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing import AuthenticationError, BufferTooShort
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from typing import Any, Protocol

from cairn._src.storage.checksum import FileEntry
from cairn._src.storage.local_files import (
    check_nothing_in_the_way,
    create_new,
    remove_local,
    temporary_sibling,
)
from cairn._src.storage.location import StorageLocation
from cairn._src.wire.sockets import set_io_timeout
from cairn._src.worker.direct_write import HashingSink
from cairn._src.worker.peer_shared import Offers
from cairn._src.worker.shared_state import serialize

# What a peer sends before each file: its bytes follow on the socket, or it writes them
# into the file offered (and then sends WRITTEN again, or FAILED).
STREAMED = b"stream"
WRITTEN = b"written"
FAILED = b"failed"

# A peer that sends nothing for this long is taken as gone (its copy is not used).
PEER_TIMEOUT_S = 30.0
# The largest message a peer sends for a file's bytes: the receiver reads each into one
# buffer of this size, reused (a fresh bytes object per message halved the throughput).
PEER_CHUNK = 8 << 20
# The most bytes of a request or of an answer's list of names.
MAX_MESSAGE = 64 << 20


@dataclass
class Outcome:
    """What one restore got from where (bytes), which peer supplied each file it took
    from a peer (``from_peers``: name -> (peer rank, size)), and why it read storage
    (``reasons``, in order). A file goes into ``from_peers`` once verified and leaves
    it when the restore does not use it after all: the peer bytes and the peer a
    restore reports are those of the files it used, never of others fetched beside
    them (a restore without files uses the states it asks for, not another rank's)."""

    memory_bytes: int = 0
    driver_bytes: int = 0
    storage_bytes: int = 0
    reasons: list[str] = field(default_factory=list)
    from_peers: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def peer_bytes(self) -> int:
        return sum(size for _, size in self.from_peers.values())

    def bytes_by_peer(self) -> dict[int, int]:
        """The bytes each peer supplied, in the order the peers first supplied a file."""
        totals: dict[int, int] = {}
        for peer_rank, size in self.from_peers.values():
            totals[peer_rank] = totals.get(peer_rank, 0) + size
        return totals

    @property
    def peer_rank(self) -> int | None:
        """The peer that supplied most of the bytes from peers (of several with as many,
        the first to supply a file); None when no peer supplied one. The event log has
        one peer per restore: where several supplied files, this is its main source."""
        totals = self.bytes_by_peer()
        return max(totals, key=totals.__getitem__, default=None)

    def described(self, source: str) -> str:
        """``source`` (a restore's sources, "peer+driver") for a log line: with the bytes
        of each peer where several supplied files (the event log names one)."""
        totals = self.bytes_by_peer()
        if len(totals) < 2:
            return source
        return source + " (" + ", ".join(f"peer rank {peer_rank}: {size} bytes"
                                         for peer_rank, size in totals.items()) + ")"


@dataclass
class Prefetched:
    """A checkpoint's files fetched from peers before the restore asked for them
    (:mod:`.peer_prefetch`): ``got`` lie verified under ``directory``, which whoever took
    this owns (and removes); ``files`` is the manifest they were checked against, at
    ``manifest_path``; ``outcome`` says what came from where and why not the rest;
    ``started`` is when the transfer began (``time.perf_counter()`` of this process)
    and ``seconds`` what it took."""

    directory: str
    manifest_path: str
    files: dict[str, FileEntry]
    got: set[str]
    outcome: Outcome
    started: float
    seconds: float
    # The states of files a peer on this machine holds in shared memory, verified, in
    # place of their bytes (:mod:`.peer_mapped`): a restore that wants files writes them.
    objects: dict[str, Any] = field(default_factory=dict)


class PrefetchSource(Protocol):
    """What :class:`RestoreSources` needs of a prefetch (see :mod:`.peer_prefetch`)."""

    @property
    def base(self) -> str | None: ...

    def take(self, manifest_location: StorageLocation,
             manifest: Any) -> Prefetched | None: ...

    def objects(self, manifest_location: StorageLocation,
                manifest: Any) -> Prefetched | None: ...

    def discard(self, *, join: bool) -> None: ...


def fetch_from_peer(authkey: bytes, peer_rank: int, address: tuple[str, int],
                    report_index: int, files: dict[str, FileEntry], wanted: set[str],
                    target: str, outcome: Outcome,
                    stop: threading.Event | None = None) -> set[str]:
    """Ask ``peer_rank``'s :class:`PeerServer` for the files ``wanted`` of report
    ``report_index`` and write each it sends under ``target``, verified against ``files``
    (the manifest's entries); the names written. What went wrong goes to ``outcome``'s
    reasons; ``stop`` (set by another thread) ends the transfer at its next chunk."""
    got: set[str] = set()
    try:
        connection = connect_peer(address, authkey)
    except (OSError, EOFError, AuthenticationError) as exc:
        outcome.reasons.append(f"peer rank {peer_rank} unreachable: "
                               f"{type(exc).__name__}: {exc}")
        return got
    buffer = bytearray(PEER_CHUNK)
    view = memoryview(buffer)
    offers: Offers | None = None
    try:
        # A peer on this machine writes into these files (see :mod:`.peer_shared`).
        offers = Offers(target, sorted(wanted, key=lambda rel: (-files[rel].size, rel)))
        connection.send((report_index, sorted(wanted), offers.wire()))
        names = receive_object(connection, stop)
        for rel in names:
            if rel not in wanted:
                raise OSError(f"peer rank {peer_rank} sent {rel!r}, not asked for")
            route = bytes(view[:_receive_into(connection, buffer, stop, peer_rank)])
            if route == WRITTEN and rel in offers:
                _wait_written(connection, offers, rel, files[rel].size, stop)
                size = offers.take(rel, files[rel])
            elif route == STREAMED:

                def fill(sink: Any, rel: str = rel, expected: int = files[rel].size) -> None:
                    total = 0
                    while size := _receive_into(connection, buffer, stop, peer_rank):
                        total += size
                        if total > expected:
                            raise OSError(f"peer rank {peer_rank} sent more of {rel!r} "
                                          f"than its {expected} bytes")
                        sink.write(view[:size])

                size = write_verified(target, rel, files[rel], fill)
            else:
                # Not the bytes themselves: they may be the checkpoint's, out of step.
                raise OSError(f"peer rank {peer_rank} answered {len(route)} bytes where "
                              f"the route of {rel!r} was due")
            if size is None:
                outcome.reasons.append(f"peer rank {peer_rank}'s copy of {rel!r} does "
                                       "not match the manifest's checksum")
                break
            outcome.from_peers[rel] = (peer_rank, size)
            got.add(rel)
    except Exception as exc:  # whatever a peer sends, storage takes over
        outcome.reasons.append(f"the transfer from peer rank {peer_rank} failed: "
                               f"{type(exc).__name__}: {exc}")
    finally:
        connection.close()
        if offers is not None:
            offers.close()
    return got


def _wait_readable(connection: Connection, stop: threading.Event | None, what: str) -> None:
    """Wait for ``connection`` to have data, at most PEER_TIMEOUT_S, and no longer than
    ``stop`` stays unset."""
    deadline = time.monotonic() + PEER_TIMEOUT_S
    while not connection.poll(0.2 if stop is not None else PEER_TIMEOUT_S):
        if stop is not None and stop.is_set():
            raise OSError("stopped: the attempt no longer needs it")
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} within {PEER_TIMEOUT_S:g}s")


def _wait_written(connection: Connection, offers: Offers, rel: str, expected: int,
                  stop: threading.Event | None) -> None:
    """Wait for the peer's word that it wrote ``rel``'s offered file: as long as the file
    keeps growing (a large file takes longer than a peer timeout) up to ``expected`` bytes,
    and no longer than ``stop`` stays unset."""
    size, deadline = -1, 0.0
    while not connection.poll(0.2):
        if stop is not None and stop.is_set():
            raise OSError("stopped: the attempt no longer needs it")
        now, grown = time.monotonic(), offers.size(rel)
        if grown > expected:
            raise OSError(f"the peer wrote more of {rel!r} than its {expected} bytes")
        if grown != size:
            size, deadline = grown, now + PEER_TIMEOUT_S
        elif now >= deadline:
            raise TimeoutError(f"no data within {PEER_TIMEOUT_S:g}s")
    if connection.recv_bytes(len(WRITTEN)) != WRITTEN:
        raise OSError("the peer could not finish writing the file")


class ConnectionSink:
    """A write-only binary sink that sends what it is given in chunks on ``connection``,
    hashing it."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._buffer = bytearray()
        self._hashed = HashingSink(None)  # what was sent, as the manifest would list it

    def writable(self) -> bool:
        return True

    def entry(self) -> FileEntry:
        return self._hashed.entry()

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._hashed.write(view)
        if len(self._buffer) + len(view) < PEER_CHUNK:
            self._buffer += view  # small records (pickle, zip headers) go together
            return len(view)
        if self._buffer:
            self._connection.send_bytes(self._buffer)
            self._buffer = bytearray()
        for start in range(0, len(view), PEER_CHUNK):  # a tensor's bytes, without a copy
            self._connection.send_bytes(view[start:start + PEER_CHUNK])
        return len(view)

    def flush(self) -> None:
        pass

    def finish(self) -> None:
        if self._buffer:
            self._connection.send_bytes(self._buffer)
            self._buffer = bytearray()
        self._connection.send_bytes(b"")


def local_host_toward(address: tuple[str, int]) -> str:
    """This host's address on the interface that reaches ``address`` (no packet sent)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(address)
        return str(probe.getsockname()[0])
    except OSError:
        return "127.0.0.1"
    finally:
        probe.close()


def connect_peer(address: tuple[str, int], authkey: bytes) -> Connection:
    """An authenticated connection to a :class:`PeerServer` at ``address``, on which
    every read and write, the handshake's included, gives up after PEER_TIMEOUT_S without
    progress."""
    sock = socket.create_connection(address, PEER_TIMEOUT_S)
    sock.settimeout(None)
    connection = Connection(sock.detach())
    try:
        set_io_timeout(connection, PEER_TIMEOUT_S)
        answer_challenge(connection, authkey)
        deliver_challenge(connection, authkey)
    except BaseException:
        connection.close()
        raise
    return connection


def receive_object(connection: Connection, stop: threading.Event | None = None) -> Any:
    """The next message, at most MAX_MESSAGE bytes (a request or a list of names)."""
    _wait_readable(connection, stop, "no answer")
    return pickle.loads(connection.recv_bytes(MAX_MESSAGE))


def _receive_into(connection: Connection, buffer: bytearray, stop: threading.Event | None,
                  peer_rank: int) -> int:
    """The next message's bytes, read into ``buffer``: their count (0: the file ended)."""
    _wait_readable(connection, stop, "no data")
    try:
        return connection.recv_bytes_into(buffer)
    except BufferTooShort:
        raise OSError(f"peer rank {peer_rank} sent a message over {len(buffer)} bytes, "
                      "more than a peer sends at once") from None


def write_verified(target: str, rel: str, entry: FileEntry,
                    fill: Callable[[Any], None]) -> int | None:
    """Write ``rel`` under ``target`` from ``fill(sink)``, hashing as it goes: its size,
    or None (nothing left behind) when size or checksum differ from ``entry``."""
    final = os.path.join(target, *rel.split("/"))
    os.makedirs(os.path.dirname(final), exist_ok=True)
    # A fresh name, created exclusively: never a link or file planted in the target (a
    # user's directory for to_directory), nor another name of the checkpoint.
    partial = temporary_sibling(final)
    try:
        with create_new(partial) as raw:
            sink = HashingSink(raw)
            fill(sink)
        got = sink.entry()
        if got.size != entry.size or got.checksum != entry.checksum:
            remove_local(partial)
            return None
        os.replace(partial, final)
        return got.size
    except BaseException:
        remove_local(partial)
        raise


def place_prefetched(prefetched: Prefetched, target: str) -> None:
    """Move ``prefetched``'s verified files to their names under ``target`` (a user's
    directory for to_directory), then remove its directory. As :func:`write_verified`,
    never through something planted there: each file replaces whatever has its name (a
    link itself, never what it points to); across file systems (``/dev/shm`` to a disk)
    its bytes go to a fresh name, created exclusively, renamed once complete; the states
    of ``objects`` are serialized there (:func:`write_verified`). A directory
    of the checkpoint may be a link of the user's to one, as for a download
    (:func:`.local_files.move_into`); anything else with its name raises before a file moves."""
    try:
        names = prefetched.got | set(prefetched.objects)
        check_nothing_in_the_way(target, {rel.rpartition("/")[0] for rel in names} - {""},
                                 names)
        for rel in sorted(prefetched.got):
            final = os.path.join(target, *rel.split("/"))
            os.makedirs(os.path.dirname(final), exist_ok=True)
            _move_file(os.path.join(prefetched.directory, *rel.split("/")), final)
        for rel, value in sorted(prefetched.objects.items()):
            if write_verified(target, rel, prefetched.files[rel],
                              functools.partial(serialize, value)) is not None:
                prefetched.got.add(rel)
            else:  # (verified when mapped; storage has it)
                prefetched.outcome.from_peers.pop(rel, None)
    finally:
        shutil.rmtree(prefetched.directory, ignore_errors=True)


def _move_file(source: str, final: str) -> None:
    try:
        os.replace(source, final)  # replaces a link at ``final``, not what it points to
        return
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
    partial = temporary_sibling(final)
    try:
        with open(source, "rb") as read, create_new(partial) as written:
            shutil.copyfileobj(read, written, PEER_CHUNK)
        os.replace(partial, final)
    except BaseException:
        remove_local(partial)
        raise
