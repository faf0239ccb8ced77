"""What a new driver finds in the run directory that this run did not write stays the
user's: a copy of a checkpoint (manifest included) is neither adopted nor deleted, and
neither is a directory under the default name of a report the run never made (contract
item 13). What a dead driver left is still settled: a manifest the index missed is
adopted, a partial upload of the next report is deleted.

Real runs through ``cairn.Trainer`` with a real worker process, on local storage and on
the S3-protocol server of ``tests/conftest.py``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest

import cairn
from cairn import Checkpoint, CheckpointConfig
from cairn._src.checkpoint.index import CheckpointRecord, RunIndex, read_index, write_index
from cairn._src.checkpoint.manager import CheckpointManager
from cairn._src.checkpoint.manifest import MANIFEST_NAME, Manifest, write_manifest
from cairn._src.checkpoint.ownership import plan_deletion
from cairn._src.run.segment_log import SegmentLog
from cairn._src.storage.fileio import (
    create_parents,
    list_dir_names,
    list_files,
    read_bytes,
    write_bytes_atomic,
)
from cairn._src.storage.location import StorageLocation, resolve
from cairn._src.storage.retry import RetryPolicy

RETRY = RetryPolicy()


def _train(config: dict[str, Any]) -> None:
    """One checkpoint a step up to ``steps``, resuming after the step it restores;
    ``names``: step (as text) -> its ``checkpoint_dir_name``."""
    start = 0
    resumed = cairn.get_checkpoint()
    if resumed is not None:
        with resumed.as_directory() as directory:
            with open(os.path.join(directory, "step"), encoding="utf-8") as f:
                start = int(f.read()) + 1
    for step in range(start, config["steps"]):
        directory = os.path.join(config["scratch"], f"attempt_{start}_step_{step}")
        os.makedirs(directory)
        with open(os.path.join(directory, "step"), "w", encoding="utf-8") as f:
            f.write(str(step))
        cairn.report({"step": step, "loss": 10 - step}, Checkpoint.from_directory(directory),
                     checkpoint_dir_name=config.get("names", {}).get(str(step)))


def _fit(storage: str, scratch: str, steps: int, names: dict[str, str] | None = None,
         **checkpoint: Any) -> cairn.Result:
    return cairn.Trainer(
        _train, train_loop_config={"steps": steps, "scratch": scratch, "names": names or {}},
        scaling_config=cairn.ScalingConfig(num_workers=1),
        run_config=cairn.RunConfig(name="run", storage_path=storage,
                                   checkpoint_config=CheckpointConfig(**checkpoint)),
    ).fit()


@pytest.fixture(params=["local", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "s3":
        return str(request.getfixturevalue("s3_uri_factory")("copies"))
    return str(tmp_path / "storage")


def _put(directory: StorageLocation, rel: str, data: bytes) -> None:
    create_parents(directory, [rel], RETRY)
    write_bytes_atomic(directory.join(*rel.split("/")), data, RETRY)


def _contents(directory: StorageLocation) -> dict[str, bytes]:
    return {rel: read_bytes(directory.join(*rel.split("/")), RETRY)
            for rel in list_files(directory, RETRY)}


def _indexed(run: StorageLocation) -> list[str]:
    index = read_index(run, RETRY)
    assert index is not None
    return [r.dir_name for r in index.checkpoints]


def test_a_copy_of_a_checkpoint_in_the_run_is_neither_adopted_nor_deleted(
        storage: str, scratch: str, caplog: pytest.LogCaptureFixture) -> None:
    keep = {"num_to_keep": 2, "checkpoint_score_attribute": "loss",
            "checkpoint_score_order": "min"}
    _fit(storage, scratch, 3, **keep)
    run = resolve(storage).join("run")
    # The user's backup of the best checkpoint, manifest included, with notes of their own.
    for rel, data in _contents(run.join("checkpoint_000003")).items():
        _put(run.join("best_backup"), rel, data)
    _put(run.join("best_backup"), "NOTES.txt", b"my notes")
    backup = _contents(run.join("best_backup"))
    assert MANIFEST_NAME in backup

    with caplog.at_level(logging.WARNING):
        result = _fit(storage, scratch, 6, **keep)  # reports 4 to 6: retention deletes

    assert ("Not adopting best_backup: its manifest is of report 3, but the index names "
            "checkpoint_000003 as the checkpoint of report 3") in caplog.text
    assert "Adopting" not in caplog.text
    assert _contents(run.join("best_backup")) == backup
    assert _indexed(run) == ["checkpoint_000005", "checkpoint_000006"]
    assert [c.path.rsplit("/", 1)[1] for c, _ in result.best_checkpoints] == [
        "checkpoint_000005", "checkpoint_000006"]

    # checkpoint_000003 is gone now, so the index names no checkpoint of report 3: the
    # copy's name still was never one this run wrote a checkpoint to.
    assert "checkpoint_000003" not in list_dir_names(run, RETRY)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        _fit(storage, scratch, 6, **keep)
    assert ("Not adopting best_backup: its manifest is of report 3, but this run writes the "
            "checkpoint of report 3 only to checkpoint_000003 or to a name its event log "
            "records before the upload, and it records none for this one") in caplog.text
    assert _contents(run.join("best_backup")) == backup
    assert _indexed(run) == ["checkpoint_000005", "checkpoint_000006"]


def test_a_directory_named_for_a_report_never_made_is_left_in_place(
        storage: str, scratch: str, caplog: pytest.LogCaptureFixture) -> None:
    _fit(storage, scratch, 3)
    run = resolve(storage).join("run")
    _put(run.join("checkpoint_000999"), "user_data.bin", b"the user's data")
    # What a driver killed while uploading the next report (4) leaves: Cairn's to delete.
    _put(run.join("checkpoint_000004"), "step", b"3")

    with caplog.at_level(logging.WARNING):
        _fit(storage, scratch, 3)

    assert read_bytes(run.join("checkpoint_000999", "user_data.bin"), RETRY) == (
        b"the user's data")
    assert ("Leaving checkpoint_000999 in place: it has no manifest and the name of the "
            "checkpoint of report 999, but this run has made 3 reports, so it did not "
            "create it.") in caplog.text
    assert "checkpoint_000004" not in list_dir_names(run, RETRY)
    assert "checkpoint_000004" not in caplog.text


def test_a_checkpoint_under_an_announced_name_the_index_missed_is_adopted(
        tmp_path: Path, scratch: str, caplog: pytest.LogCaptureFixture) -> None:
    storage = str(tmp_path / "storage")
    names = {"2": "epoch-2"}
    _fit(storage, scratch, 3, names)
    run = resolve(storage).join("run")
    # As a driver killed between the manifest of report 3 and the index leaves it.
    index = read_index(run, RETRY)
    assert index is not None and [r.dir_name for r in index.checkpoints][-1] == "epoch-2"
    write_index(run, index.with_changes(checkpoints=index.checkpoints[:-1],
                                        next_report_index=3), RETRY)
    # The user's copy of it beside it, which only its name tells from the original.
    for rel, data in _contents(run.join("epoch-2")).items():
        _put(run.join("epoch-2-copy"), rel, data)

    with caplog.at_level(logging.WARNING):
        result = _fit(storage, scratch, 3, names)

    assert "Adopting 1 committed checkpoints the index did not name: ['epoch-2']" in (
        caplog.text)
    assert "Not adopting epoch-2-copy: its manifest is of report 3" in caplog.text
    assert _indexed(run) == ["checkpoint_000001", "checkpoint_000002", "epoch-2"]
    assert result.checkpoint is not None and result.checkpoint.path.endswith("/epoch-2")
    assert "epoch-2-copy" in list_dir_names(run, RETRY)


def test_two_manifests_of_one_report_the_index_missed_are_both_left(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Both under names this run may use (one announced): one is a copy, and which one
    # cannot be told.
    run = resolve(str(tmp_path / "run"))
    for name in ("checkpoint_000003", "epoch-3"):
        write_manifest(run.join(name), Manifest(files={}, report_index=3), RETRY)
    index = RunIndex(next_report_index=3)
    write_index(run, index, RETRY)
    manager = CheckpointManager(run, CheckpointConfig(), RETRY, index,
                                SegmentLog(run.join("metrics"), RETRY))
    with caplog.at_level(logging.WARNING):
        manager.reconcile(started={"epoch-3"})
    assert manager.index.checkpoints == ()
    assert ("Not adopting checkpoint_000003: its manifest is of report 3, but epoch-3 holds "
            "a manifest of report 3 too") in caplog.text
    assert sorted(list_dir_names(run, RETRY)) == ["cairn_run.json", "checkpoint_000003",
                                                   "epoch-3"]


def test_deletion_refuses_a_default_name_of_another_report() -> None:
    # An index that names a copy of report 2's checkpoint under report 9's default name
    # (rebuilt from the manifests, or forged): never the run's to delete.
    record = CheckpointRecord(dir_name="checkpoint_000009", report_index=2)
    plan = plan_deletion(record, manifest=Manifest(files={}, report_index=2), registered={},
                         delete_references=False)
    assert not plan.checkpoint_dir and not plan.reference
    assert plan.refusals == ("checkpoint_000009 is not the directory this run gives the "
                             "checkpoint of report 2; a run deletes only its own checkpoint "
                             "directories",)
