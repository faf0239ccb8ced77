"""A run index whose record names both target_uri and target_path is a damaged index:
ManifestError, which open_run answers by rebuilding the index from the manifests
(Result.from_path rebuilds it in memory: tests/train/test_result_from_damaged_index.py)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from cairn import CheckpointConfig, ManifestError
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


def test_open_run_rebuilds_the_index_from_the_manifests(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = _run_with_a_conflicting_record(tmp_path)
    with caplog.at_level(logging.WARNING):
        opened = open_run(resolve(str(root)), CheckpointConfig(), RETRY)
    assert [(r.dir_name, r.target_uri, r.target_path, r.managed)
            for r in opened.index.checkpoints] == [("checkpoint_000001", None, None, True)]
    assert "rebuilding the run index from the checkpoint manifests" in caplog.text
