"""A replacement rank's peer transfer, started with its process instead of at its restore.

With ``FailureConfig(keep_survivors=True)``, a rank whose :class:`RestorePlan` names the
copies of surviving peers (and not its own) fetches the planned checkpoint's files from
them on a background thread (``cairn-peer-prefetch``) from the moment its worker has its
setup, while the train function imports, builds its model and so on: first in place
from a peer on this machine whose snapshot lies in shared memory (:mod:`.peer_mapped`;
``load_training_state`` then uses those states, verified, without a file), then the
usual way. The first restore of
that checkpoint (``get_checkpoint().as_directory()``, ``load_training_state``) waits for
the thread and takes its files (:meth:`PeerPrefetch.take`); what the peers did not send
verified comes from storage, as without a prefetch, and the ``RestoredMessage`` says so.

The prefetch reads the checkpoint's manifest from storage itself (one small file): its
names are checked with ``check_relative_path`` and every file is verified against its size
and checksum as it arrives (``peer_fetch.fetch_from_peer``), as a restore does. The
restore uses the files only for the same manifest (same location, same entries).

Ownership: the thread owns its connection and its directory until it finishes; then the
result passes, under a lock, to whichever comes first: the restore that takes it (and
then owns the directory), or :meth:`PeerPrefetch.discard` (the attempt ended, or a later
checkpoint committed), which removes it. A discard while the thread runs makes it stop
at its next chunk and remove its directory itself.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable
from typing import Any

from cairn._src.checkpoint.manifest import read_manifest
from cairn._src.checkpoint.views import CheckpointView
from cairn._src.storage.location import StorageLocation
from cairn._src.storage.paths import check_relative_path
from cairn._src.storage.retry import RetryPolicy
from cairn._src.storage.scratch import make_directory
from cairn._src.wire.messages import RestorePlan
from cairn._src.worker.memory_copy import MemoryCopies, RestoreSources
from cairn._src.worker.peer_fetch import (
    PEER_TIMEOUT_S,
    Outcome,
    Prefetched,
    fetch_from_peer,
    local_host_toward,
)
from cairn._src.worker.peer_mapped import fetch_mapped

logger = logging.getLogger(__name__)


class PeerPrefetch:
    """Fetches ``view``'s files (the checkpoint of ``plan``) from ``plan.peers`` into a
    new directory under ``base`` (None: the temporary directory), on its own thread,
    started here. Thread-safe: :meth:`take` (the train function's thread) and
    :meth:`discard` (any thread)."""

    def __init__(self, *, plan: RestorePlan, view: CheckpointView, authkey: bytes,
                 retry: RetryPolicy, rank: int) -> None:
        self._plan = plan
        self._view = view
        self._authkey = authkey
        self._retry = retry
        self._rank = rank
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._done = threading.Event()
        self._result: Prefetched | None = None
        # Where the files go, once the manifest says how large they are (set once).
        self._base: str | None = None
        self._base_known = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cairn-peer-prefetch",
                                        daemon=True)
        self._thread.start()

    @property
    def base(self) -> str | None:
        """The directory the files are fetched under (``/dev/shm`` when it has room for
        them twice over; None: the temporary directory), once the manifest was read."""
        self._base_known.wait()
        return self._base

    def objects(self, manifest_location: StorageLocation, manifest: Any) -> Prefetched | None:
        """Wait for the transfer; its result when it is of this manifest, left in place
        (for :meth:`take`, by a restore that wants files): its ``objects`` are what a
        restore without files uses."""
        self._done.wait()
        with self._lock:
            result = self._result
        return result if result is not None and _of(result, manifest_location, manifest) \
            else None

    def take(self, manifest_location: StorageLocation, manifest: Any) -> Prefetched | None:
        """Wait for the transfer; its result (the caller owns its directory from now on)
        when it is of this manifest, else None. Once only: a later call gets None."""
        self._done.wait()
        with self._lock:
            result, self._result = self._result, None
        if result is None:
            return None
        if not _of(result, manifest_location, manifest):
            logger.info("Rank %d: the prefetched copy is of another checkpoint than the one "
                        "restored (%s); not used", self._rank, manifest_location.display())
            shutil.rmtree(result.directory, ignore_errors=True)
            return None
        return result

    def discard(self, *, join: bool) -> None:
        """Not needed (any more): stop the transfer, remove what it fetched; with
        ``join``, wait for the thread (at most one peer timeout)."""
        self._stop.set()
        with self._lock:
            result, self._result = self._result, None
        if result is not None:
            shutil.rmtree(result.directory, ignore_errors=True)
        if join and self._thread is not threading.current_thread():
            self._thread.join(PEER_TIMEOUT_S)

    def _run(self) -> None:
        started = time.perf_counter()
        result: Prefetched | None = None
        try:
            result = self._fetch(started)
        except Exception:
            # The restore finds no prefetch and asks the peers itself (then storage).
            logger.warning("Rank %d: prefetching the checkpoint from peers failed",
                           self._rank, exc_info=True)
        finally:
            with self._lock:
                keep = result is not None and not self._stop.is_set()
                if keep:
                    self._result = result
            if not keep and result is not None:
                shutil.rmtree(result.directory, ignore_errors=True)
            self._base_known.set()
            self._done.set()

    def _fetch(self, started: float) -> Prefetched | None:
        plan, view = self._plan, self._view
        manifest = read_manifest(view.manifest_at, self._retry)
        if manifest is None or manifest.report_index != plan.report_index:
            return None
        files = dict(manifest.files)
        for rel in files:
            check_relative_path(rel, argument="manifest files")
        self._base = RestoreSources.scratch_base(sum(e.size for e in files.values()))
        self._base_known.set()
        directory = make_directory(self._base)
        outcome = Outcome(reasons=[plan.reason] if plan.reason else [])
        missing = set(files)
        objects: dict[str, Any] = {}
        try:
            for peer_rank, host, port in plan.peers:  # in place, a peer on this machine
                if not missing or self._stop.is_set():
                    break
                if local_host_toward((host, port)) == host:
                    objects.update(fetch_mapped(self._authkey, peer_rank, (host, port),
                                                plan.report_index, files, missing, outcome,
                                                self._stop))
                    missing -= set(objects)
            for peer_rank, host, port in plan.peers:
                if not missing or self._stop.is_set():
                    break
                missing -= fetch_from_peer(self._authkey, peer_rank, (host, port),
                                           plan.report_index, files, missing, directory,
                                           outcome, self._stop)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        seconds = time.perf_counter() - started
        logger.info("Rank %d prefetched %d of %d files of report %d from peers in %.2fs",
                    self._rank, len(files) - len(missing), len(files), plan.report_index,
                    seconds)
        return Prefetched(directory, view.manifest_at.path, files,
                          set(files) - missing - set(objects), outcome, started, seconds,
                          objects)


def _of(result: Prefetched, manifest_location: StorageLocation, manifest: Any) -> bool:
    """Whether ``result`` was fetched for this manifest (same location, same entries)."""
    return (result.manifest_path == manifest_location.path
            and result.files == dict(manifest.files))


def start_prefetch(plan: RestorePlan | None, view: CheckpointView | None,
                   run: StorageLocation, authkey: bytes, retry: RetryPolicy,
                   rank: int) -> PeerPrefetch | None:
    """A prefetch of the planned checkpoint when ``plan`` names peers' copies and not this
    rank's own, and ``view`` (the checkpoint the attempt resumes from) is that checkpoint
    in the run's directory; None otherwise."""
    if (plan is None or plan.own_memory or not plan.peers or view is None
            or view.report_index != plan.report_index
            or view.manifest_at.path != run.join(view.dir_name).path):
        return None
    return PeerPrefetch(plan=plan, view=view, authkey=authkey, retry=retry, rank=rank)


def restore_sources(setup: Any, memory: MemoryCopies | None, tier: Any,
                    send: Callable[[object], None], retry: RetryPolicy) -> Any:
    """The ``LocalCopies`` a worker's checkpoints restore through: ``tier`` (the local
    tier, or None) unless this process keeps memory copies (``keep_survivors``); then a
    :class:`RestoreSources`, with its peer transfer started now where the plan names
    peers."""
    if memory is None:
        return tier
    prefetch = start_prefetch(setup.restore, setup.resume, setup.run, memory.authkey,
                              retry, setup.rank)
    return RestoreSources(plan=setup.restore, memory=memory, run=setup.run,
                          authkey=memory.authkey, rank=setup.rank, fallback=tier, send=send,
                          prefetch=prefetch)
