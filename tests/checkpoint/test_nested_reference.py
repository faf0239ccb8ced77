"""A reference whose data lies inside its own checkpoint directory: a
``checkpoint_upload_fn`` that writes ``build_checkpoint_path_from_name(name) + "/dcp"`` and
returns that directory. The manifest goes into ``<run>/<name>/``, the parent of the data;
retention forgets the checkpoint, it does not delete the data with the manifest's
directory (unless ``delete_unmanaged_checkpoints=True``), and a later driver does not
delete it as a partial upload either."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cairn import CheckpointConfig
from cairn._src.checkpoint.index import read_index
from cairn._src.checkpoint.manager import CheckpointManager
from cairn._src.checkpoint.opening import open_run
from cairn._src.checkpoint.views import ReadyCheckpoint
from cairn._src.run.events import Event
from cairn._src.run.layout import default_checkpoint_dir_name
from cairn._src.run.segment_log import SegmentLog
from cairn._src.storage.location import StorageLocation, resolve
from cairn._src.storage.retry import RetryPolicy

RETRY = RetryPolicy()
TORN_MANIFEST = "_cairn_manifest.json.cairn-tmp-" + "0123456789abcdef" * 2


class EventLogSink:
    """The run's event log, as the controller's event stream writes it."""

    def __init__(self, run: StorageLocation) -> None:
        self.log = SegmentLog(run.join("events"), RETRY)

    def emit(self, event: Event) -> None:
        self.log.append(event.to_record())

    def flush(self) -> None:
        self.log.flush()


def manager_for(run: StorageLocation, config: CheckpointConfig) -> CheckpointManager:
    opened = open_run(run, config, RETRY)
    return CheckpointManager(run, config, RETRY, opened.index,
                             SegmentLog(run.join("metrics"), RETRY), events=EventLogSink(run),
                             registered=opened.registered)


def upload_fn_result(run_dir: Path, index: int, extra: dict[str, bytes]) -> Path:
    """What a checkpoint_upload_fn(checkpoint, name) writing into
    build_checkpoint_path_from_name(name) + "/dcp" leaves, and returns."""
    named = run_dir / default_checkpoint_dir_name(index)
    (named / "dcp").mkdir(parents=True)
    (named / "dcp" / "__0_0.distcp").write_bytes(b"shard %d" % index)
    (named / "dcp" / ".metadata").write_bytes(b"dcp metadata")
    for name, data in extra.items():
        (named / name).write_bytes(data)
    return named / "dcp"


def commit_reports(run: StorageLocation, run_dir: Path, config: CheckpointConfig,
                   reports: range, extra: dict[str, bytes] | None = None) -> None:
    manager = manager_for(run, config)
    for index in reports:
        data = upload_fn_result(run_dir, index, extra or {})
        ready = ReadyCheckpoint(
            index=index, dir_name=default_checkpoint_dir_name(index),
            metrics={"step": index}, entries={}, ranks=(0,),
            reference=run.join(default_checkpoint_dir_name(index), "dcp"),
            metadata={}, bytes_uploaded=0)
        outcome = manager.commit(ready, attempt=1)
        if index == reports[0]:
            # A manifest write of this checkpoint torn by a crash: Cairn's, so it goes.
            (data.parent / TORN_MANIFEST).write_bytes(b"{")
        manager.delete_dropped(outcome.dropped)
    assert manager.failed_deletions == {}


def indexed(run: StorageLocation) -> list[str]:
    index = read_index(run, RETRY)
    assert index is not None
    return [r.dir_name for r in index.checkpoints]


def make_run(tmp_path: Path) -> tuple[StorageLocation, Path]:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    return resolve(str(run_dir)), run_dir


def test_retention_forgets_a_reference_inside_its_checkpoint_directory(tmp_path: Path) -> None:
    run, run_dir = make_run(tmp_path)
    config = CheckpointConfig(num_to_keep=1)
    commit_reports(run, run_dir, config, range(1, 4))

    assert indexed(run) == ["checkpoint_000003"]
    for index in (1, 2):
        named = run_dir / default_checkpoint_dir_name(index)
        # The user's data stays where the upload function wrote it...
        assert (named / "dcp" / "__0_0.distcp").read_bytes() == b"shard %d" % index
        assert (named / "dcp" / ".metadata").read_bytes() == b"dcp metadata"
        # ... and Cairn's own files are gone: the manifest, a torn write of it.
        assert sorted(p.name for p in named.iterdir()) == ["dcp"]
    assert (run_dir / "checkpoint_000003" / "_cairn_manifest.json").is_file()

    # A later driver neither deletes the forgotten data as a partial upload, nor adopts
    # it back, nor uploads into its directory.
    manager = manager_for(run, config)
    assert indexed(run) == ["checkpoint_000003"]
    assert (run_dir / "checkpoint_000001" / "dcp" / "__0_0.distcp").is_file()
    assert (run_dir / "checkpoint_000002" / "dcp" / "__0_0.distcp").is_file()
    assert {"checkpoint_000001", "checkpoint_000002"} <= manager.names_holding_references()
    manager.delete_uncommitted(["checkpoint_000001"])
    assert (run_dir / "checkpoint_000001" / "dcp" / "__0_0.distcp").is_file()


def test_delete_unmanaged_checkpoints_deletes_the_registered_data_and_then_the_directory(
        tmp_path: Path) -> None:
    run, run_dir = make_run(tmp_path)
    config = CheckpointConfig(num_to_keep=1, delete_unmanaged_checkpoints=True)
    commit_reports(run, run_dir, config, range(1, 3))

    assert indexed(run) == ["checkpoint_000002"]
    # This run registered checkpoint_000001/dcp and the user asked: it goes, and the
    # directory that held it and the manifest, now empty, with it.
    assert not (run_dir / "checkpoint_000001").exists()
    assert (run_dir / "checkpoint_000002" / "dcp" / "__0_0.distcp").is_file()


def test_what_else_the_user_wrote_beside_the_registered_data_stays(tmp_path: Path) -> None:
    run, run_dir = make_run(tmp_path)
    config = CheckpointConfig(num_to_keep=1, delete_unmanaged_checkpoints=True)
    commit_reports(run, run_dir, config, range(1, 3), extra={"notes.txt": b"mine"})

    # Only the registered reference (dcp/) was the user's to have deleted.
    named = run_dir / "checkpoint_000001"
    assert sorted(p.name for p in named.iterdir()) == ["notes.txt"]
    assert (named / "notes.txt").read_bytes() == b"mine"
    manager_for(run, config)
    assert (named / "notes.txt").read_bytes() == b"mine"


def test_a_reference_registered_elsewhere_still_loses_its_manifest_directory(
        tmp_path: Path) -> None:
    # The usual case is unchanged: data outside the checkpoint's directory is forgotten
    # and the manifest's directory, Cairn's alone, is deleted.
    run, run_dir = make_run(tmp_path)
    manager = manager_for(run, CheckpointConfig(num_to_keep=1))
    kwargs: dict[str, Any] = {"entries": {}, "ranks": (0,), "metadata": {},
                              "bytes_uploaded": 0}
    for index in (1, 2):
        (run_dir / "refs" / f"r{index}").mkdir(parents=True)
        (run_dir / "refs" / f"r{index}" / "w.bin").write_bytes(b"w")
        outcome = manager.commit(ReadyCheckpoint(
            index=index, dir_name=default_checkpoint_dir_name(index), metrics={},
            reference=run.join("refs", f"r{index}"), **kwargs), attempt=1)
        manager.delete_dropped(outcome.dropped)
    assert indexed(run) == ["checkpoint_000002"]
    assert not (run_dir / "checkpoint_000001").exists()
    assert (run_dir / "refs" / "r1" / "w.bin").is_file()
