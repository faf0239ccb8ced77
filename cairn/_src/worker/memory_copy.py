"""A kept rank's copy in memory of the latest committed checkpoint, served to itself and,
over an authenticated socket, to the rank that replaces a failed one (on the same machine,
used in place where the snapshot lies in shared memory: :mod:`.peer_mapped`; else
written into files that rank offers: :mod:`.peer_shared`).

With ``FailureConfig(keep_survivors=True)`` a worker process outlives a failed attempt.
The snapshot a ``report_snapshot`` wrote (its CPU buffers, see
``cairn._src.torch.snapshot``) is then not freed once written: :class:`MemoryCopies`
holds it until its report commits, keeps it as *the committed copy* until a later one
commits, and frees the one it replaces. Serialization is deterministic, so serializing the
held state again gives the bytes that were written, and their XXH3 is checked against the
manifest's before anything is served: a copy that is not exactly the committed checkpoint
(changed buffers, a later snapshot, none) is never used.

:class:`RestoreSources` is what ``get_checkpoint().as_directory()`` (and
``to_directory``, ``load_training_state``) restores through on a kept or replaced rank:
the driver's :class:`RestorePlan` names the sources, in order: the rank's own memory copy,
then the copies of surviving peers (fetched over :class:`PeerServer`'s socket and verified
as they arrive; by a replacement rank from the start of its process, see
:mod:`.peer_prefetch`), then storage for whatever file none of them holds verified. Each restore
is reported to the controller (:class:`RestoredMessage`: bytes from each source, the
reason storage was read), which records it in the event log.

Thread-safety: :class:`MemoryCopies` is shared by the uploader (``hold``), the receiver
(``committed``), the peer server's thread and the train function's thread (restores),
under one lock; a copy being read is freed only once its last reader is done.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Collection, Mapping
from copy import deepcopy
from dataclasses import dataclass, field
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, Listener, answer_challenge, deliver_challenge
from typing import Any

from cairn._src.storage.checksum import FileEntry
from cairn._src.storage.location import StorageLocation
from cairn._src.storage.paths import check_relative_path
from cairn._src.storage.retry import RetryPolicy
from cairn._src.storage.scratch import SHARED_MEMORY, sweep_stale
from cairn._src.storage.transfer import download_directory
from cairn._src.wire.messages import MemoryCopyInfo, RestoredMessage, RestorePlan
from cairn._src.wire.sockets import abort_connection, set_io_timeout
from cairn._src.worker.direct_write import DirectWriter, HashingSink, entry_of_bytes
from cairn._src.worker.peer_fetch import (
    FAILED,
    PEER_TIMEOUT_S,
    STREAMED,
    WRITTEN,
    ConnectionSink,
    Outcome,
    PrefetchSource,
    fetch_from_peer,
    place_prefetched,
    receive_object,
    write_verified,
)
from cairn._src.worker.peer_mapped import MAPPED, answer_mapped, private_view
from cairn._src.worker.peer_shared import open_offered
from cairn._src.worker.shared_state import load_bytes, serialize

logger = logging.getLogger(__name__)

# How many connections a peer server authenticates at once (more wait), each how long.
HANDSHAKES = 16
HANDSHAKE_TIMEOUT_S = 10.0
# A restore's source (RestoredMessage.source) when this node's local tier held it all.
LOCAL_TIER = "local tier"


@dataclass(eq=False)
class _Copy:
    report_index: int
    writer: DirectWriter
    entries: dict[str, FileEntry]
    readers: int = 0
    dropped: bool = False
    # Files being sent to a peer now, and those sent in full: their entry as hashed
    # while sending and when (time.monotonic()), for this rank's own restore to use once.
    serving: set[str] = field(default_factory=set)
    sent: dict[str, tuple[FileEntry, float]] = field(default_factory=dict)


class MemoryCopies:
    """This process's held snapshots (see the module docstring). One per worker process,
    across attempts; ``authkey`` and ``host`` (None: not served) are what :meth:`serve`
    listens with."""

    def __init__(self, authkey: bytes, host: str | None) -> None:
        self.authkey = authkey
        self.host = host
        self._lock = threading.Lock()
        self._served = threading.Condition(self._lock)  # a file sent to a peer
        self._pending: dict[int, _Copy] = {}
        self._committed: _Copy | None = None
        self._server: PeerServer | None = None

    def hold(self, report_index: int, writer: DirectWriter,
             entries: Mapping[str, FileEntry]) -> bool:
        """Keep ``writer`` (the snapshot of ``report_index``, written with ``entries``)
        until its commit is known; False (the caller frees it) when it cannot be kept."""
        retain = getattr(writer, "retain", None)
        if retain is None or not retain():
            return False
        with self._lock:
            # An uncommitted copy of the same report index (written before a failure,
            # never committed) is replaced.
            replaced = self._pending.pop(report_index, None)
            self._pending[report_index] = _Copy(report_index, writer, dict(entries))
            freed = replaced is not None and self._drop(replaced)
        if freed and replaced is not None:
            replaced.writer.close()
        return True

    def committed(self, report_index: int) -> None:
        """Report ``report_index`` committed: its copy (if held) becomes the committed
        copy; older ones are freed."""
        with self._lock:
            copy = self._pending.pop(report_index, None)
            stale = [c for i, c in self._pending.items() if i < report_index]
            for c in stale:
                del self._pending[c.report_index]
            if copy is not None:
                if self._committed is not None:
                    stale.append(self._committed)
                self._committed = copy
            elif self._committed is not None and self._committed.report_index < report_index:
                # A later checkpoint committed that this rank holds no copy of.
                stale.append(self._committed)
                self._committed = None
            freed = [c for c in stale if self._drop(c)]
        for c in freed:
            c.writer.close()

    def info(self) -> MemoryCopyInfo | None:
        """The copies held (the committed one, or -1, and those whose commit this process
        has not heard of yet), and where they are served."""
        with self._lock:
            copy, pending, server = self._committed, tuple(sorted(self._pending)), self._server
        if copy is None and not pending:
            return None
        return MemoryCopyInfo(-1 if copy is None else copy.report_index,
                              server.address if server else None, pending)

    def serve(self) -> None:
        """Start serving the held copies to peers (once; where a host is known)."""
        with self._lock:
            if self._server or self.host is None or not (self._committed or self._pending):
                return
        try:
            server = PeerServer(self, self.authkey, self.host)
        except OSError as exc:
            logger.warning("Cannot serve this rank's checkpoint copy to peers: %s", exc)
            return
        with self._lock:
            self._server = server

    def _drop(self, copy: _Copy) -> bool:
        copy.dropped = True
        return copy.readers == 0

    def acquire(self, report_index: int) -> _Copy | None:
        """The committed copy of ``report_index`` for reading (give it back with
        :meth:`release`), or None."""
        with self._lock:
            copy = self._committed
            if copy is None or copy.report_index != report_index or copy.dropped:
                return None
            copy.readers += 1
            return copy

    def sending(self, copy: _Copy, rel: str) -> None:
        """The peer server starts sending ``rel`` of ``copy``."""
        with self._served:
            copy.serving.add(rel)

    def sent(self, copy: _Copy, rel: str, entry: FileEntry | None) -> None:
        """The peer server is done with ``rel``: ``entry`` is what it sent in full, as
        hashed while sending (None: the send failed)."""
        with self._served:
            copy.serving.discard(rel)
            if entry is not None:
                copy.sent[rel] = (entry, time.monotonic())
            self._served.notify_all()

    def sent_entry(self, copy: _Copy, rel: str) -> FileEntry | None:
        """The entry of ``rel`` of ``copy`` as just sent to a peer, once (after waiting
        for a send in progress, at most a peer timeout); None when none was sent lately.
        A send is a serialization of the same buffers: this rank's own restore need not
        serialize them a second time to check them."""
        deadline = time.monotonic() + PEER_TIMEOUT_S
        with self._served:
            while rel in copy.serving and time.monotonic() < deadline:
                self._served.wait(deadline - time.monotonic())
            entry, at = copy.sent.pop(rel, (None, 0.0))
        return entry if time.monotonic() - at < PEER_TIMEOUT_S else None

    def release(self, copy: _Copy) -> None:
        with self._lock:
            copy.readers -= 1
            free = copy.dropped and copy.readers == 0
        if free:
            copy.writer.close()


def _serialize_into(copy: _Copy, rel: str, sink: Any) -> None:
    """Serialize ``rel`` of ``copy`` again into ``sink`` (the bytes that were written)."""
    copy.writer.write_file(rel, sink)


def _write_bytes(data: bytes, sink: Any) -> None:
    sink.write(data)


def _write_each(target: str, files: Mapping[str, FileEntry], names: set[str],
                fill: Callable[[str], Callable[[Any], None] | None], copy_of: str,
                reasons: list[str]) -> dict[str, int]:
    """Each of ``names`` written under ``target`` from ``fill(rel)`` (None: nothing to
    write) when its size and checksum are ``files``'; the size of each written. For each
    other one ``reasons`` gets "<copy_of> does not match the manifest's checksum"."""
    got: dict[str, int] = {}
    for rel in sorted(names):
        source = fill(rel)
        size = write_verified(target, rel, files[rel], source) if source else None
        if size is None:
            reasons.append(f"{copy_of.format(rel)} does not match the manifest's checksum")
        else:
            got[rel] = size
    return got


class PeerServer:
    """Serves ``copies``' committed copy on ``host``: a listener whose connections each
    authenticate with the run's secret within :data:`HANDSHAKE_TIMEOUT_S`, at most
    :data:`HANDSHAKES` at once (more wait for a slot), then are answered, each on its own
    thread (``cairn-peer-copy``, daemons): the files this process holds of the report a
    request names, serialized again from memory (only read). Every later read and write
    gives up after PEER_TIMEOUT_S without progress: a stalled client holds nobody up."""

    def __init__(self, copies: MemoryCopies, authkey: bytes, host: str) -> None:
        self._copies = copies
        self._authkey = authkey
        self._listener = Listener((host, 0), backlog=HANDSHAKES)
        self._handshakes = threading.BoundedSemaphore(HANDSHAKES)
        address = self._listener.address
        self.address = (str(address[0]), int(address[1]))
        threading.Thread(target=self._serve, name="cairn-peer-copy", daemon=True).start()

    def _serve(self) -> None:
        while True:
            self._handshakes.acquire()
            connection: Connection | None = None
            try:
                connection = self._listener.accept()
                threading.Thread(target=self._handle, args=(connection,),
                                 name="cairn-peer-copy", daemon=True).start()
            except Exception as exc:  # a client that went away, or no thread to be had
                self._handshakes.release()
                if connection is not None:
                    connection.close()
                logger.debug("A peer's connection was not served: %s", exc)

    def _handle(self, connection: Connection) -> None:
        # For the whole handshake (as the controller's): no trickling client keeps a slot.
        deadline = threading.Timer(HANDSHAKE_TIMEOUT_S, abort_connection, (connection,))
        try:
            deadline.start()
            try:
                deliver_challenge(connection, self._authkey)
                answer_challenge(connection, self._authkey)
            finally:
                deadline.cancel()
                self._handshakes.release()
            set_io_timeout(connection, PEER_TIMEOUT_S)
            self._answer(connection)
        except (OSError, EOFError, AuthenticationError) as exc:
            logger.info("A peer's checkpoint transfer ended early: %s", exc)
        except Exception:
            logger.warning("Serving a checkpoint copy to a peer failed", exc_info=True)
        finally:
            connection.close()

    def _answer(self, connection: Connection) -> None:
        request = receive_object(connection)
        report_index, wanted = int(request[0]), [str(n) for n in request[1]]
        copy = self._copies.acquire(report_index)
        if copy is None:
            connection.send(())
            return
        offers = request[2] if len(request) > 2 and isinstance(request[2], dict) else {}
        try:
            names = tuple(n for n in wanted if n in copy.entries)
            if len(request) > 3 and request[3] == MAPPED:
                return answer_mapped(connection, copy.writer, names)  # holds it till closed
            connection.send(names)
            for rel in names:
                self._copies.sending(copy, rel)
                sent = None
                try:
                    sent = _send_file(connection, copy, rel, offers.get(rel))
                finally:
                    self._copies.sent(copy, rel, sent)
        finally:
            self._copies.release(copy)


def _send_file(connection: Connection, copy: _Copy, rel: str,
               offer: object) -> FileEntry | None:
    """Serialize ``rel`` of ``copy`` again for a peer: into the file it offered when this
    process can write it (one machine, see :mod:`.peer_shared`), else over ``connection``.
    What was sent, as hashed while sending; None when writing the offered file failed."""
    file = open_offered(offer, gone=lambda: connection.poll(0))  # silent until its end
    if file is None:
        connection.send_bytes(STREAMED)
        sink = ConnectionSink(connection)
        _serialize_into(copy, rel, sink)
        sink.finish()
        return sink.entry()
    with file:
        connection.send_bytes(WRITTEN)
        hashed = HashingSink(file)
        try:
            _serialize_into(copy, rel, hashed)
        except OSError as exc:
            logger.info("Writing %r into a peer's file failed: %s", rel, exc)
            connection.send_bytes(FAILED)
            return None
    connection.send_bytes(WRITTEN)
    return hashed.entry()


class RestoreSources:
    """A rank's restore of the checkpoint its :class:`RestorePlan` names (the ``LocalCopies``
    of its ``StorageOptions``): its memory copy, then peers, then storage for the rest;
    ``fallback`` (the local tier) or storage when none holds a file, as any other checkpoint."""

    def __init__(self, *, plan: RestorePlan | None, memory: MemoryCopies | None,
                 run: StorageLocation, authkey: bytes, rank: int, fallback: Any,
                 send: Callable[[object], None], prefetch: PrefetchSource | None = None,
                 ) -> None:
        self._plan = plan
        self._memory = memory
        self._run = run
        self._authkey = authkey
        self._rank = rank
        self._fallback = fallback
        self._send = send
        # The planned checkpoint's files, fetched from a peer from the start of the attempt
        # (a replacement rank); the first restore of that checkpoint takes them.
        self._prefetch = prefetch

    def committed(self, report_index: int) -> None:
        """Report ``report_index`` committed (the receiver thread): the local tier drops
        older copies; a prefetch not taken yet of an older checkpoint is not needed."""
        if self._fallback is not None:
            self._fallback.committed(report_index)
        if (self._prefetch is not None and self._plan is not None
                and report_index > self._plan.report_index):
            self._prefetch.discard(join=False)

    def close(self) -> None:
        """The attempt ends: a prefetch not taken is stopped and its files removed. (Not
        at the stop of an attempt: the train function may still restore until its next
        report or collective, and the event log says what that restore used.)"""
        if self._prefetch is not None:
            self._prefetch.discard(join=True)

    def scratch_directory(self, size: int) -> str | None:
        """Where a restore of ``size`` bytes from memory is written: ``/dev/shm`` (RAM)
        when it has room for it twice over, else None (the temporary directory); where a
        prefetch writes (so that its files move there without a copy) when there is one."""
        if self._prefetch is not None:
            return self._prefetch.base
        return self.scratch_base(size) if self._plan is not None else None

    @staticmethod
    def scratch_base(size: int) -> str | None:
        """``/dev/shm`` when it has room for ``size`` bytes twice over (after removing what
        killed processes left there: :func:`.scratch.sweep_stale`), else None."""
        if not os.path.isdir(SHARED_MEMORY) or not os.access(SHARED_MEMORY, os.W_OK):
            return None
        sweep_stale(SHARED_MEMORY)
        try:
            free = shutil.disk_usage(SHARED_MEMORY).free
        except OSError:
            return None
        return SHARED_MEMORY if free > 2 * size else None

    def restore(self, manifest_location: StorageLocation, manifest: Any, target: str,
                retry: RetryPolicy) -> bool:
        plan = self._plan
        dir_name = manifest_location.path.rstrip("/").rsplit("/", 1)[-1]
        expected = self._run.join(dir_name)
        if (plan is None or manifest.report_index != plan.report_index
                or (manifest_location.path, manifest_location.display())
                != (expected.path, expected.display())):
            return self._fall_back(manifest_location, manifest, target, retry)
        started = time.perf_counter()
        files: dict[str, FileEntry] = dict(manifest.files)
        for rel in files:
            check_relative_path(rel, argument="manifest files")
        outcome = Outcome()
        missing = set(files)
        prefetched = (self._prefetch.take(manifest_location, manifest)
                      if self._prefetch is not None else None)
        if prefetched is not None:
            # The peers were asked from the attempt's start: their verified files move
            # into ``target``; reasons, bytes and start time are the prefetch's.
            outcome = prefetched.outcome
            started = min(started, prefetched.started)
            place_prefetched(prefetched, target)
            missing -= prefetched.got
        elif plan.own_memory and self._memory is not None:
            missing -= self._from_memory(plan.report_index, files, missing, target, outcome)
        elif not plan.own_memory and plan.reason:
            outcome.reasons.append(plan.reason)
        for peer_rank, host, port in plan.peers if prefetched is None else ():
            if not missing:
                break
            missing -= fetch_from_peer(self._authkey, peer_rank, (host, port),
                                       plan.report_index, files, missing, target, outcome)
        if missing and plan.driver_files:
            missing -= self._from_driver(plan.driver_files, files, missing, target, outcome)
        if missing == set(files):
            # Nothing from memory: this node's local tier, if it holds the checkpoint,
            # else the usual restore (the caller reads storage, a local path as it is).
            tier = self._fall_back(manifest_location, manifest, target, retry)
            self._report(plan, outcome, started, prefetched=prefetched is not None,
                         storage_bytes=0 if tier else sum(e.size for e in files.values()),
                         tier=tier)
            return tier
        if missing:
            rest = {rel: files[rel] for rel in sorted(missing)}
            download_directory(manifest_location, target, files=rest, verify=True,
                               retry=retry)
            outcome.storage_bytes = sum(e.size for e in rest.values())
            outcome.reasons.append(f"no verified copy of {sorted(rest)} in memory")
        self._report(plan, outcome, started, storage_bytes=outcome.storage_bytes,
                     prefetched=prefetched is not None)
        return True

    def verified_objects(self, manifest_location: StorageLocation, manifest: Any,
                         names: list[str], shared: Collection[str] = ()) -> dict[str, Any] | None:
        """A kept rank's own restore without bytes: the held state of each file of
        ``names`` (deep copies: the copy stays as it is; the held objects themselves for
        the files of ``shared``, which the caller only copies from), when this rank's plan is its
        memory copy, the copy holds every one of them, and each serializes again to the
        manifest's size and checksum; None otherwise (restore from files)."""
        plan, memory = self._plan, self._memory
        dir_name = manifest_location.path.rstrip("/").rsplit("/", 1)[-1]
        if (plan is None or manifest.report_index != plan.report_index
                or manifest_location.path != self._run.join(dir_name).path):
            return None
        if not plan.own_memory:
            return self._peer_objects(plan, manifest_location, manifest, names, shared)
        if memory is None:
            return None
        started = time.perf_counter()
        copy = memory.acquire(plan.report_index)
        if copy is None:
            return None
        value = getattr(copy.writer, "value", None)
        try:
            wanted = [n for n in names if n in manifest.files]
            if value is None or not wanted or not all(n in copy.entries for n in wanted):
                return None  # (none of ``names`` in the checkpoint: nothing restored)
            # Shared files where they lie in shared memory: over a private mapping (a load
            # hook that writes them cannot reach what a peer maps), verified as handed out.
            views = {rel: view for rel in wanted if rel in shared
                     and (view := private_view(copy.writer, rel)) is not None}
            for rel in wanted:
                sink = HashingSink(None)
                if rel in views:
                    serialize(views[rel], sink)
                elif memory.sent_entry(copy, rel) == manifest.files[rel]:
                    continue  # just serialized for a peer, and hashed as it went
                else:
                    _serialize_into(copy, rel, sink)
                if sink.entry() != manifest.files[rel]:
                    logger.warning("Rank %d: the memory copy of %r does not match the "
                                   "manifest's checksum; restoring from files", self._rank, rel)
                    return None
            objects = {rel: views[rel] if rel in views else value(rel) if rel in shared
                       else deepcopy(value(rel)) for rel in wanted}
        finally:
            memory.release(copy)
        outcome = Outcome(memory_bytes=sum(manifest.files[n].size for n in wanted))
        self._report(plan, outcome, started, storage_bytes=0)
        return objects

    def _peer_objects(self, plan: RestorePlan, manifest_location: StorageLocation,
                      manifest: Any, names: list[str],
                      shared: Collection[str]) -> dict[str, Any] | None:
        """A replacement rank's restore without bytes: the states its prefetch mapped from
        a peer on this machine (verified), the rest of ``names`` from the driver's copies
        (checked against the manifest); None (restore from files) when not all are."""
        prefetched = (self._prefetch.objects(manifest_location, manifest)
                      if self._prefetch is not None else None)
        wanted = [n for n in names if n in manifest.files]
        if prefetched is None or not prefetched.objects or not wanted:
            return None
        started = time.perf_counter()
        # Of the peers' files, only those this restore uses count (and name its peer).
        outcome = Outcome(reasons=list(prefetched.outcome.reasons))
        objects: dict[str, Any] = {}
        try:
            for rel in wanted:
                value = prefetched.objects.get(rel)
                source = prefetched.outcome.from_peers.get(rel)
                if value is not None and source is not None:
                    objects[rel] = value if rel in shared else deepcopy(value)
                    outcome.from_peers[rel] = source
                    continue
                data = plan.driver_files.get(rel)
                if not isinstance(data, bytes) or entry_of_bytes(data) != manifest.files[rel]:
                    return None
                objects[rel] = load_bytes(data)
                outcome.driver_bytes += len(data)
        except Exception as exc:  # a driver's copy torch will not load: files, as usual
            logger.debug("Rank %d restores from files: %s", self._rank, exc)
            return None
        self._report(plan, outcome, min(started, prefetched.started), storage_bytes=0,
                     prefetched=True)
        return objects

    def _fall_back(self, manifest_location: StorageLocation, manifest: Any, target: str,
                   retry: RetryPolicy) -> bool:
        if self._fallback is None:
            return False
        return bool(self._fallback.restore(manifest_location, manifest, target, retry))

    def _from_memory(self, report_index: int, files: dict[str, FileEntry], wanted: set[str],
                     target: str, outcome: Outcome) -> set[str]:
        assert self._memory is not None
        copy = self._memory.acquire(report_index)
        if copy is None:
            outcome.reasons.append(f"this rank holds no copy of report {report_index}")
            return set()
        try:
            got = _write_each(target, files, wanted & set(copy.entries),
                              lambda rel: functools.partial(_serialize_into, copy, rel),
                              "this rank's memory copy of {!r}", outcome.reasons)
        finally:
            self._memory.release(copy)
        outcome.memory_bytes += sum(got.values())
        return set(got)

    @staticmethod
    def _from_driver(kept: Mapping[str, bytes], files: dict[str, FileEntry],
                     wanted: set[str], target: str, outcome: Outcome) -> set[str]:
        """The files of ``wanted`` the driver kept (``RestorePlan.driver_files``), each
        written under ``target`` when its size and checksum are the manifest's."""
        got = _write_each(target, files, wanted & set(kept),
                          lambda rel: (functools.partial(_write_bytes, kept[rel])
                                       if isinstance(kept[rel], bytes) else None),
                          "the driver's copy of {!r}", outcome.reasons)
        outcome.driver_bytes += sum(got.values())
        return set(got)

    def _report(self, plan: RestorePlan, outcome: Outcome, started: float,
                storage_bytes: int, prefetched: bool = False, tier: bool = False) -> None:
        parts = [name for name, n in (("memory", outcome.memory_bytes),
                                      ("peer", outcome.peer_bytes),
                                      ("driver", outcome.driver_bytes), (LOCAL_TIER, tier)) if n]
        if storage_bytes or not parts:
            parts.append("storage")
        source = "+".join(parts)
        reason = "; ".join(outcome.reasons)
        if "storage" in parts:
            logger.warning("Rank %d restores report %d from %s: %s", self._rank,
                           plan.report_index, outcome.described(source), reason)
        else:
            logger.info("Rank %d restored report %d from %s", self._rank, plan.report_index,
                        outcome.described(source))
        try:
            self._send(RestoredMessage(
                self._rank, plan.report_index, source, reason, outcome.memory_bytes,
                outcome.peer_bytes, storage_bytes, time.perf_counter() - started,
                outcome.peer_rank, prefetched, outcome.driver_bytes))
        except OSError:
            pass


def serve_copy(memory: MemoryCopies | None) -> MemoryCopyInfo | None:
    """A stopping kept rank: serve its held copies to peers; what it holds, and where."""
    if memory is not None:
        memory.serve()
    return None if memory is None else memory.info()
