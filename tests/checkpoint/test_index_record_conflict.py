"""A run index whose record names both target_uri and target_path is a damaged index:
ManifestError, which open_run answers by rebuilding the index from the manifests, and
Result.from_path by rebuilding it in memory, writing nothing."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from cairn import CheckpointConfig, ManifestError, Result
from cairn._src.checkpoint.index import CheckpointRecord, RunIndex, read_index, write_index
from cairn._src.checkpoint.manifest import Manifest, write_manifest
from cairn._src.checkpoint.opening import open_run
from cairn._src.storage.location import resolve
from cairn._src.storage.retry import RetryPolicy
from cairn._src.storage.transfer import compute_entries

RETRY = RetryPolicy()


def _run_with_a_conflicting_record(tmp_path: Path) -> Path:
    root = tmp_path / "run"
    (root / "checkpoint_000001").mkdir(parents=True)
    (root / "checkpoint_000001" / "a.bin").write_bytes(b"a")
    run = resolve(str(root))
    write_manifest(run.join("checkpoint_000001"), Manifest(
        files=compute_entries(run.join("checkpoint_000001"), ["a.bin"]), report_index=1),
        RETRY)
    write_index(run, RunIndex(checkpoints=(CheckpointRecord(
        dir_name="checkpoint_000001", report_index=1),), next_report_index=2), RETRY)
    index_file = root / "cairn_run.json"
    body = json.loads(index_file.read_text())
    body["checkpoints"][0].update(target_uri="s3://bucket/ckpt", target_path="/data/ckpt",
                                  managed=False)
    index_file.write_text(json.dumps(body))
    return root


def test_the_record_is_reported_as_a_damaged_index(tmp_path: Path) -> None:
    root = _run_with_a_conflicting_record(tmp_path)
    with pytest.raises(ManifestError, match=r"run index .*cairn_run\.json.* is invalid: "
                                            r".*target_uri=.*target_path=.*both set"):
        read_index(resolve(str(root)), RETRY)


def _files(root: Path) -> dict[str, bytes | None]:
    """Every entry under ``root`` by relative path: a file's bytes, None for a directory."""
    entries: dict[str, bytes | None] = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs:
            entries[os.path.relpath(os.path.join(directory, name), root)] = None
        for name in files:
            path = os.path.join(directory, name)
            entries[os.path.relpath(path, root)] = Path(path).read_bytes()
    return entries


def test_result_from_path_rebuilds_the_index_in_memory(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = _run_with_a_conflicting_record(tmp_path)
    before = _files(root)
    with caplog.at_level(logging.WARNING):
        result = Result.from_path(root)
    assert result.checkpoint is not None
    assert result.checkpoint.path == str(root / "checkpoint_000001")
    assert [(c.path, metrics) for c, metrics in result.best_checkpoints] == [
        (str(root / "checkpoint_000001"), {})]
    assert f"The run index {root / 'cairn_run.json'} is invalid: " in caplog.text
    assert "both set" in caplog.text
    assert ("Reading the run from its checkpoint manifests instead, in memory "
            "(Result.from_path writes nothing).") in caplog.text
    # The damaged index stays as it was, and no lease was taken.
    assert _files(root) == before


def test_open_run_rebuilds_the_index_from_the_manifests(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = _run_with_a_conflicting_record(tmp_path)
    with caplog.at_level(logging.WARNING):
        opened = open_run(resolve(str(root)), CheckpointConfig(), RETRY)
    assert [(r.dir_name, r.target_uri, r.target_path, r.managed)
            for r in opened.index.checkpoints] == [("checkpoint_000001", None, None, True)]
    assert "rebuilding the run index from the checkpoint manifests" in caplog.text
