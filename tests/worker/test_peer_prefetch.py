"""A replacement rank's peer transfer started before its restore (keep_survivors): the
restore takes the prefetched, verified files; a prefetch nobody takes leaves nothing
behind (real sockets on loopback, a plain writer, a run directory on local disk)."""

from __future__ import annotations

import errno
import os
import shutil
import time
from pathlib import Path

import pytest
from test_memory_copy import KEY, entry, serving_peer

from cairn._src.checkpoint.manifest import Manifest, write_manifest
from cairn._src.checkpoint.views import CheckpointView
from cairn._src.storage.location import StorageLocation, resolve
from cairn._src.storage.retry import DEFAULT_RETRY
from cairn._src.wire.messages import RestoredMessage, RestorePlan
from cairn._src.worker import peer_prefetch
from cairn._src.worker.memory_copy import MemoryCopies, RestoreSources
from cairn._src.worker.peer_prefetch import PeerPrefetch, start_prefetch

STORED = {"model.pt": b"weights" * 1000, "rank_1/rank_state.pt": b"rng"}
DIR = "checkpoint_000002"


def committed_run(tmp_path: Path, stored: dict[str, bytes] = STORED,
                  ) -> tuple[StorageLocation, Manifest]:
    """A run whose report 2 (``stored``, in ``DIR``) is committed: it, its manifest."""
    run = resolve(str(tmp_path / "run"))
    for rel, data in stored.items():
        (tmp_path / "run" / DIR / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "run" / DIR / rel).write_bytes(data)
    manifest = Manifest(files={rel: entry(data) for rel, data in stored.items()},
                        report_index=2)
    write_manifest(run.join(DIR), manifest)
    return run, manifest


def _serving_peer() -> tuple[MemoryCopies, RestorePlan]:
    peer, address = serving_peer(KEY, {"model.pt": STORED["model.pt"]})
    return peer, RestorePlan(2, False, ((0, *address),), "a replaced rank")


def _prefetch(run: StorageLocation, plan: RestorePlan) -> PeerPrefetch:
    view = CheckpointView(DIR, 2, run.join(DIR), run.join(DIR), {})
    prefetch = start_prefetch(plan, view, run, KEY, DEFAULT_RETRY, rank=1)
    assert prefetch is not None
    return prefetch


def _fetched(tmp_path: Path) -> tuple[StorageLocation, Manifest, RestorePlan, PeerPrefetch,
                                      str]:
    """A committed run, a serving peer and a prefetch of its copy that has finished: the
    run, its manifest, the plan, the prefetch and the directory it fetched into."""
    run, manifest = committed_run(tmp_path)
    _, plan = _serving_peer()
    prefetch = _prefetch(run, plan)
    prefetch._done.wait(60)
    assert prefetch._result is not None
    return run, manifest, plan, prefetch, prefetch._result.directory


def test_the_restore_takes_the_files_fetched_before_it_asked(tmp_path: Path) -> None:
    run, manifest = committed_run(tmp_path)
    peer, plan = _serving_peer()
    prefetch = _prefetch(run, plan)
    prefetch._done.wait(60)
    peer.committed(3)  # the peer no longer serves report 2: only the prefetch holds it
    sent: list[object] = []
    sources = RestoreSources(plan=plan, memory=None, run=run, authkey=KEY, rank=1,
                             fallback=None, send=sent.append, prefetch=prefetch)
    base = sources.scratch_directory(10)
    assert base == prefetch.base
    target = tmp_path / "restored"
    target.mkdir()
    assert sources.restore(run.join(DIR), manifest, str(target), DEFAULT_RETRY)
    assert {p: (target / p).read_bytes() for p in STORED} == STORED
    [message] = sent
    assert isinstance(message, RestoredMessage) and message.prefetched
    assert (message.source, message.peer_rank) == ("peer+storage", 0)
    assert message.peer_bytes == len(STORED["model.pt"]) and message.storage_bytes == 3
    assert message.reason.startswith("a replaced rank; no verified copy of")
    assert prefetch.take(run.join(DIR), manifest) is None  # taken once


def test_a_restore_that_waited_for_the_prefetch_counts_its_time_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The restore asks while the transfer still runs (as a replacement whose model is
    # built before its peer finished): the record's seconds run from the transfer's
    # start to the restore's end, not the transfer's time plus the restore's wait for it.
    real = peer_prefetch.fetch_from_peer

    def slow_fetch(*args: object, **kwargs: object) -> set[str]:
        time.sleep(1.0)
        return real(*args, **kwargs)

    monkeypatch.setattr(peer_prefetch, "fetch_from_peer", slow_fetch)
    run, manifest = committed_run(tmp_path)
    _, plan = _serving_peer()
    began = time.perf_counter()
    prefetch = _prefetch(run, plan)
    sent: list[object] = []
    sources = RestoreSources(plan=plan, memory=None, run=run, authkey=KEY, rank=1,
                             fallback=None, send=sent.append, prefetch=prefetch)
    target = tmp_path / "restored"
    target.mkdir()
    assert sources.restore(run.join(DIR), manifest, str(target), DEFAULT_RETRY)
    elapsed = time.perf_counter() - began
    [message] = sent
    assert isinstance(message, RestoredMessage) and message.prefetched
    assert 1.0 <= message.seconds <= elapsed


def test_a_prefetch_nobody_takes_is_removed_when_the_attempt_ends(tmp_path: Path) -> None:
    run, _, plan, prefetch, directory = _fetched(tmp_path)
    assert os.path.isfile(os.path.join(directory, "model.pt"))
    sources = RestoreSources(plan=plan, memory=None, run=run, authkey=KEY, rank=1,
                             fallback=None, send=lambda _: None, prefetch=prefetch)
    sources.close()
    assert not os.path.exists(directory)


def test_a_later_commit_drops_a_prefetch_not_taken(tmp_path: Path) -> None:
    run, _, plan, prefetch, directory = _fetched(tmp_path)
    sources = RestoreSources(plan=plan, memory=None, run=run, authkey=KEY, rank=1,
                             fallback=None, send=lambda _: None, prefetch=prefetch)
    sources.committed(2)  # the planned checkpoint itself: kept
    assert os.path.isdir(directory)
    sources.committed(3)
    assert not os.path.exists(directory)


def test_a_prefetch_of_another_manifest_is_not_used(tmp_path: Path) -> None:
    run, manifest, _, prefetch, directory = _fetched(tmp_path)
    other = Manifest(files={**manifest.files, "extra.pt": entry(b"x")}, report_index=2)
    assert prefetch.take(run.join(DIR), other) is None
    assert not os.path.exists(directory)


def test_no_prefetch_without_peers_or_for_a_rank_restoring_its_own_copy(
    tmp_path: Path,
) -> None:
    run = resolve(str(tmp_path / "run"))
    view = CheckpointView(DIR, 2, run.join(DIR), run.join(DIR), {})
    for plan in (None, RestorePlan(2, True, ((0, "127.0.0.1", 1),)),
                 RestorePlan(2, False, ()), RestorePlan(3, False, ((0, "127.0.0.1", 1),))):
        assert start_prefetch(plan, view, run, KEY, DEFAULT_RETRY, rank=1) is None


def _restore_prefetched(tmp_path: Path, target: Path,
                        monkeypatch: pytest.MonkeyPatch | None = None,
                        full: bool = False) -> list[object]:
    """The replacement's restore of the prefetched copy into ``target`` (made already);
    what it sent. With ``monkeypatch``, renames out of the prefetch's directory fail
    during the restore as across file systems (/dev/shm to a disk); with ``full`` too,
    copying a file's bytes fails as on a full disk."""
    run, manifest = committed_run(tmp_path)
    peer, plan = _serving_peer()
    prefetch = _prefetch(run, plan)
    prefetch._done.wait(60)
    peer.committed(3)
    assert prefetch._result is not None
    if monkeypatch is not None:
        _crossing_devices(monkeypatch, prefetch._result.directory)
        if full:
            _disk_full(monkeypatch)
    sent: list[object] = []
    sources = RestoreSources(plan=plan, memory=None, run=run, authkey=KEY, rank=1,
                             fallback=None, send=sent.append, prefetch=prefetch)
    try:
        assert sources.restore(run.join(DIR), manifest, str(target), DEFAULT_RETRY)
    finally:
        if monkeypatch is not None:
            monkeypatch.undo()
    return sent


def _crossing_devices(monkeypatch: pytest.MonkeyPatch, fetched: str) -> None:
    for name in ("rename", "replace"):
        real = getattr(os, name)

        def crossing(src: str, dst: str, *args: object, real: object = real,
                     **kwargs: object) -> None:
            if os.fspath(src).startswith(fetched):
                raise OSError(errno.EXDEV, "Invalid cross-device link", src)
            real(src, dst, *args, **kwargs)  # type: ignore[operator]

        monkeypatch.setattr(os, name, crossing)


def _disk_full(monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "sendfile", full)  # shutil.copyfile's way on Linux
    monkeypatch.setattr(shutil, "copyfileobj", full)


def test_a_prefetched_file_replaces_a_link_to_a_directory_and_writes_nothing_there(
    tmp_path: Path,
) -> None:
    # to_directory(path): a link planted in the user's directory under a file's name
    # is replaced, the file is not moved into the directory it points to.
    outside = tmp_path / "outside"
    outside.mkdir()
    target = tmp_path / "restored"
    target.mkdir()
    (target / "model.pt").symlink_to(outside, target_is_directory=True)
    _restore_prefetched(tmp_path, target)
    assert os.listdir(outside) == []
    assert not (target / "model.pt").is_symlink()
    assert {p: (target / p).read_bytes() for p in STORED} == STORED


def test_a_prefetched_file_copied_across_file_systems_writes_through_no_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"the victim's file")
    victim.chmod(0o600)
    target = tmp_path / "restored"
    target.mkdir()
    (target / "model.pt").symlink_to(victim)
    _restore_prefetched(tmp_path, target, monkeypatch)
    assert victim.read_bytes() == b"the victim's file"
    assert victim.stat().st_mode & 0o777 == 0o600
    assert not (target / "model.pt").is_symlink()
    assert {p: (target / p).read_bytes() for p in STORED} == STORED
    assert sorted(os.listdir(target)) == ["model.pt", "rank_1"]  # no temporary left


def test_a_failed_copy_across_file_systems_leaves_nothing_under_the_file_s_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"the victim's file")
    target = tmp_path / "restored"
    target.mkdir()
    (target / "model.pt").symlink_to(victim)
    with pytest.raises(OSError, match="No space left"):
        _restore_prefetched(tmp_path, target, monkeypatch, full=True)
    assert victim.read_bytes() == b"the victim's file"
    assert os.listdir(target) == ["model.pt"] and (target / "model.pt").is_symlink()
