"""What a dead driver left in the run directory is settled before the run goes on."""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path

import fsspec
import pytest

from cairn import CheckpointConfig
from cairn._src.checkpoint.index import CheckpointRecord, RunIndex, read_index, write_index
from cairn._src.checkpoint.manager import CheckpointManager
from cairn._src.checkpoint.manifest import Manifest, write_manifest
from cairn._src.run.segment_log import SegmentLog
from cairn._src.storage.location import resolve
from cairn._src.storage.retry import RetryPolicy
from cairn._src.storage.transfer import compute_entries

RETRY = RetryPolicy()


def test_reconcile_adopts_deletes_partials_and_keeps_reference_data(tmp_path: Path) -> None:
    run = resolve(str(tmp_path / "run"))
    (tmp_path / "run").mkdir()
    # A checkpoint committed by reference, its data inside the run directory.
    (tmp_path / "run" / "my_refs" / "step_1").mkdir(parents=True)
    (tmp_path / "run" / "my_refs" / "step_1" / "w.bin").write_bytes(b"w")
    reference = run.join("my_refs", "step_1")
    write_manifest(run.join("checkpoint_000001"), Manifest(
        files=compute_entries(reference, ["w.bin"]), report_index=1,
        target_uri=reference.uri), RETRY)
    index = RunIndex(checkpoints=(CheckpointRecord(
        dir_name="checkpoint_000001", report_index=1, target_uri=reference.uri,
        managed=True),), next_report_index=2)
    write_index(run, index, RETRY)
    # The metrics history of the reports made: 1 to 3 (epoch_2 and epoch_3 were announced).
    history = SegmentLog(run.join("metrics"), RETRY)
    for report in (1, 2, 3):
        history.append({"report_index": report, "metrics": {}})
    history.flush()
    # A committed checkpoint the index missed (driver killed between manifest and index).
    (tmp_path / "run" / "epoch_2").mkdir()
    (tmp_path / "run" / "epoch_2" / "a.bin").write_bytes(b"a")
    write_manifest(run.join("epoch_2"), Manifest(
        files=compute_entries(run.join("epoch_2"), ["a.bin"]), report_index=2), RETRY)
    # Partial uploads under a recorded custom name and a default name, a directory of the
    # user's own (logs), and a torn atomic write of the index
    for partial in ("epoch_3", "checkpoint_000004", "tensorboard"):
        (tmp_path / "run" / partial).mkdir()
        (tmp_path / "run" / partial / "half.bin").write_bytes(b"h")
    # (the name write_bytes_atomic gives it: the final name, the mark, a uuid4's 32 hex digits).
    (tmp_path / "run" / f"cairn_run.json.cairn-tmp-{uuid.uuid4().hex}").write_bytes(b"{")

    manager = CheckpointManager(run, CheckpointConfig(), RETRY, index,
                                SegmentLog(run.join("metrics"), RETRY))
    manager.reconcile(started={"epoch_2", "epoch_3"})

    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
        "cairn_run.json", "checkpoint_000001", "epoch_2", "metrics", "my_refs", "tensorboard"]
    reread = read_index(run, RETRY)
    assert reread is not None
    assert [r.dir_name for r in reread.checkpoints] == ["checkpoint_000001", "epoch_2"]
    assert reread.next_report_index == 3


def test_reconcile_keeps_the_data_of_a_reference_recorded_by_path() -> None:
    # A run on a filesystem object without a URI records its references as paths. Data
    # reported by reference under a default checkpoint name, without a manifest of its
    # own, is a committed checkpoint's: a new driver neither deletes it nor reuses its name.
    fs = fsspec.filesystem("memory")
    root = f"/reconcile-{uuid.uuid4().hex}/run"
    run = resolve(root, filesystem=fs)
    assert run.uri is None
    fs.pipe(f"{root}/checkpoint_000500/w.bin", b"w")
    data = run.join("checkpoint_000500")
    target_path = "/" + data.path.lstrip("/")
    write_manifest(run.join("checkpoint_000001"), Manifest(
        files=compute_entries(data, ["w.bin"]), report_index=1, target_path=target_path),
        RETRY)
    index = RunIndex(checkpoints=(CheckpointRecord(
        dir_name="checkpoint_000001", report_index=1, target_path=target_path,
        managed=True),), next_report_index=2)
    write_index(run, index, RETRY)
    try:
        manager = CheckpointManager(run, CheckpointConfig(), RETRY, index,
                                    SegmentLog(run.join("metrics"), RETRY))
        assert manager.names_holding_references() == {"checkpoint_000500"}
        manager.reconcile()

        assert fs.cat(f"{root}/checkpoint_000500/w.bin") == b"w"
        assert manager.view(manager.index.checkpoints[0]).data.path == data.path
    finally:
        fs.rm(root.rsplit("/", 1)[0], recursive=True)


def test_reconcile_neither_adopts_nor_deletes_a_checkpoint_directory_that_is_a_link(
        tmp_path: Path) -> None:
    # The user's own copy of a checkpoint (Cairn's manifest in it) linked into the run
    # under a name Cairn writes: not the run's, so the index does not gain it (which would
    # later let retention delete its manifest).
    run = resolve(str(tmp_path / "run"))
    (tmp_path / "run").mkdir()
    exported = tmp_path / "user" / "exported"
    exported.mkdir(parents=True)
    (exported / "a.bin").write_bytes(b"a")
    write_manifest(resolve(str(exported)), Manifest(
        files=compute_entries(resolve(str(exported)), ["a.bin"]), report_index=1), RETRY)
    (tmp_path / "run" / "checkpoint_000001").symlink_to(exported)
    index = RunIndex(next_report_index=2)
    write_index(run, index, RETRY)

    manager = CheckpointManager(run, CheckpointConfig(), RETRY, index,
                                SegmentLog(run.join("metrics"), RETRY))
    manager.reconcile()

    reread = read_index(run, RETRY)
    assert reread is not None and reread.checkpoints == ()
    assert (tmp_path / "run" / "checkpoint_000001").is_symlink()
    assert sorted(p.name for p in exported.iterdir()) == ["_cairn_manifest.json", "a.bin"]


def test_an_adoption_fsyncs_the_index_only_when_the_run_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cairn._src.checkpoint.opening import open_run

    synced: list[int] = []
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd))
    for durable in (False, True):
        run = resolve(str(tmp_path / f"run_{durable}"))
        (tmp_path / f"run_{durable}" / "checkpoint_000001").mkdir(parents=True)
        (tmp_path / f"run_{durable}" / "checkpoint_000001" / "a.bin").write_bytes(b"a")
        write_manifest(run.join("checkpoint_000001"), Manifest(
            files=compute_entries(run.join("checkpoint_000001"), ["a.bin"]),
            report_index=1), RETRY, durable=False)
        write_index(run, RunIndex(next_report_index=1), RETRY, durable=False)
        synced.clear()
        opened = open_run(run, CheckpointConfig(), RETRY, durable=durable)
        assert [r.dir_name for r in opened.index.checkpoints] == ["checkpoint_000001"]
        # RunConfig(storage_fsync=False): the adopted index is written without an fsync.
        assert bool(synced) is durable


def test_reconcile_deletes_only_the_torn_writes_cairn_leaves_in_the_run_directory(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from cairn._src.checkpoint.opening import open_run

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run = resolve(str(run_dir))
    write_index(run, RunIndex(next_report_index=1), RETRY)
    # What Cairn's atomic writes leave when the process dies between write and rename.
    torn = [f"{final}.cairn-tmp-{uuid.uuid4().hex}"
            for final in ("cairn_run.json", "lease.json", "_cairn_storage_check.json")]
    for name in torn:
        (run_dir / name).write_bytes(b"{")
    # Named with the mark, but none of them is that: a directory (a killed
    # Checkpoint.to_directory(<run>) leaves its staging directory, or anyone plants one),
    # even one under exactly a torn write's name; the user's files; a link.
    (run_dir / "x.cairn-tmp-y").mkdir()
    (run_dir / "x.cairn-tmp-y" / "kept.bin").write_bytes(b"k")
    as_dir = f"cairn_run.json.cairn-tmp-{uuid.uuid4().hex}"
    (run_dir / as_dir).mkdir()
    (run_dir / "notes.cairn-tmp-mine.txt").write_bytes(b"mine")
    user_named = f"model.pt.cairn-tmp-{uuid.uuid4().hex}"
    (run_dir / user_named).write_bytes(b"weights")
    (tmp_path / "elsewhere.txt").write_bytes(b"theirs")
    link = f"lease.json.cairn-tmp-{uuid.uuid4().hex}"
    (run_dir / link).symlink_to(tmp_path / "elsewhere.txt")
    left = sorted(["x.cairn-tmp-y", as_dir, "notes.cairn-tmp-mine.txt", user_named, link])

    with caplog.at_level(logging.WARNING):
        for _ in range(2):  # and again at the next start
            open_run(run, CheckpointConfig(), RETRY)

    assert sorted(p.name for p in run_dir.iterdir()) == sorted(["cairn_run.json", *left])
    assert (run_dir / "x.cairn-tmp-y" / "kept.bin").read_bytes() == b"k"
    assert (run_dir / "notes.cairn-tmp-mine.txt").read_bytes() == b"mine"
    assert (tmp_path / "elsewhere.txt").read_bytes() == b"theirs"
    warnings = [r.getMessage() for r in caplog.records
                if "temporary-file mark" in r.getMessage()]
    assert len(warnings) == 2 and all(repr(left) in w for w in warnings)
