"""A planted manifest cannot make the run's report numbering jump (issue 26, item 7).

The schema bounds ``report_index`` (at most 2**53 - 1), and a manifest the index does not
name is adopted only up to one past the reports the run has made.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from cairn import CheckpointConfig
from cairn._src.checkpoint.index import RunIndex, rebuild_index
from cairn._src.checkpoint.manager import CheckpointManager
from cairn._src.checkpoint.manifest import MANIFEST_NAME, Manifest, read_manifest, write_manifest
from cairn._src.errors import ConfigError, ManifestError
from cairn._src.run.segment_log import SegmentLog
from cairn._src.storage.location import StorageLocation, resolve
from cairn._src.storage.retry import RetryPolicy

RETRY = RetryPolicy(max_attempts=2, initial_backoff_s=0.0)


def plant(run: StorageLocation, name: str, report_index: int) -> None:
    write_manifest(run.join(name), Manifest(files={}, report_index=report_index), RETRY)


@pytest.fixture
def run(tmp_path: Path) -> StorageLocation:
    """A run that has made two reports (its metrics history says so)."""
    location = resolve(str(tmp_path / "run"))
    history = SegmentLog(location.join("metrics"), RETRY)
    for index in (1, 2):
        history.append({"report_index": index, "metrics": {"step": index}})
    history.flush()
    return location


def test_a_huge_report_index_is_refused_by_the_schema(tmp_path: Path) -> None:
    directory = tmp_path / "checkpoint_000001"
    directory.mkdir()
    body = json.loads(Manifest(files={}, report_index=1).to_json())
    body["report_index"] = 10**30
    (directory / MANIFEST_NAME).write_text(json.dumps(body))
    with pytest.raises(ManifestError,
                       match=r"checkpoint_000001/_cairn_manifest.json is invalid: field "
                             r"'report_index' is 1000000000000000000000000000000 \(int\); "
                             r"expected null or an integer <= 9007199254740991\."):
        read_manifest(resolve(str(directory)), RETRY)
    with pytest.raises(ConfigError, match=r"Manifest.report_index=10{30} must be None or an "
                                          r"int from 0 to 9007199254740991"):
        Manifest(files={}, report_index=10**30)


def test_reconcile_does_not_adopt_a_manifest_beyond_the_reports_made(
        run: StorageLocation, caplog: pytest.LogCaptureFixture) -> None:
    plant(run, "checkpoint_000003", 3)  # the one a dead driver may have left: adopted
    plant(run, "planted", 10**6)
    manager = CheckpointManager(run, CheckpointConfig(), RETRY, RunIndex(next_report_index=3),
                                SegmentLog(run.join("metrics"), RETRY))
    with caplog.at_level(logging.WARNING):
        manager.reconcile()
    assert [r.dir_name for r in manager.index.checkpoints] == ["checkpoint_000003"]
    assert manager.index.next_report_index == 4
    assert ("Not adopting planted: its manifest is of report 1000000, but this run has made "
            "2 reports") in caplog.text
    assert os.path.exists(os.path.join(run.path, "planted", MANIFEST_NAME))  # not deleted


def test_a_rebuilt_index_leaves_out_a_manifest_beyond_the_reports_made(
        run: StorageLocation, caplog: pytest.LogCaptureFixture) -> None:
    plant(run, "checkpoint_000002", 2)
    plant(run, "planted", 10**6)
    with caplog.at_level(logging.WARNING):
        index = rebuild_index(run, RETRY)
    assert [r.dir_name for r in index.checkpoints] == ["checkpoint_000002"]
    assert index.next_report_index == 3
    assert "Skipping planted while rebuilding the index" in caplog.text
