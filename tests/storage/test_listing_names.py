"""Names in a listing that are not safe single path components are skipped (issue 26,
item 3): anyone who can write a bucket can create the key ``runs/run/../planted.txt``,
and the store then lists ``..`` under the run."""

from __future__ import annotations

import io
import logging
import uuid
from typing import Any

import pytest

from cairn import CheckpointConfig
from cairn._src.checkpoint.index import RunIndex, rebuild_index
from cairn._src.checkpoint.manager import CheckpointManager
from cairn._src.run.segment_log import SegmentLog, read_log
from cairn._src.storage.fileio import list_dir_names, list_files
from cairn._src.storage.location import StorageLocation, resolve
from cairn._src.storage.retry import RetryPolicy

RETRY = RetryPolicy(max_attempts=2, initial_backoff_s=0.0)


@pytest.fixture
def planted_run(dict_store: Any) -> StorageLocation:
    """A run directory on the ``dictstore://`` store whose listing holds ``..``, a name
    with a backslash, and one real entry."""
    prefix = f"bucket/{uuid.uuid4().hex[:10]}/run"
    for key in (f"{prefix}/../planted.txt", f"{prefix}/a\\b/x.txt",
                f"{prefix}/events/../x.jsonl", f"{prefix}/checkpoint_000001/../../y",
                f"{prefix}/user_logs/log.txt"):
        dict_store.write(key, io.BytesIO(b"planted"))
    return resolve(f"dictstore://{prefix}")


def test_unsafe_names_are_skipped_with_one_counted_warning(
        planted_run: StorageLocation, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="cairn"):
        names = list_dir_names(planted_run, RETRY)
    assert names == ["checkpoint_000001", "events", "user_logs"]
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert warnings[0].startswith("Skipped 2 names under ")
    assert "not safe path components: '..', 'a\\\\b'" in warnings[0]


def test_recursive_listings_skip_paths_through_unsafe_names(
        planted_run: StorageLocation, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="cairn"):
        files = list_files(planted_run.join("checkpoint_000001"), RETRY)
    assert files == {}
    assert "Skipped 1 names under" in caplog.text and "'../../y'" in caplog.text


def test_a_run_listing_dot_dot_still_starts(planted_run: StorageLocation) -> None:
    # What fit() does at start: reconcile, rebuild the index, read the logs.
    manager = CheckpointManager(planted_run, CheckpointConfig(), RETRY, RunIndex(),
                                SegmentLog(planted_run.join("metrics"), RETRY))
    manager.reconcile()
    assert rebuild_index(planted_run, RETRY).checkpoints == ()
    assert read_log(planted_run.join("events"), RETRY) == []


def _report(config: dict[str, Any]) -> None:
    import cairn

    cairn.report({"resumed": cairn.get_checkpoint() is not None})


def test_a_name_that_is_not_utf8_beside_a_run_is_skipped(
        tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    # A file another tool wrote into the run directory (a Latin-1 name), and a folder of
    # that kind beside the run: no name Cairn writes; fit() and listings go on without it.
    import os

    import cairn

    storage = tmp_path / "storage"
    config = cairn.RunConfig(name="run", storage_path=str(storage))
    local = cairn.ScalingConfig(num_workers=0)
    cairn.Trainer(_report, scaling_config=local, run_config=config).fit()
    with open(os.path.join(os.fsencode(storage / "run"), b"notes\xe9.txt"), "wb") as f:
        f.write(b"the user's")
    os.mkdir(os.path.join(os.fsencode(storage), b"\xff"))
    with caplog.at_level(logging.WARNING, logger="cairn"):
        assert list_dir_names(resolve(str(storage)), RETRY) == ["run"]
    assert "Skipped 1 names" in caplog.text and "<a name that is not UTF-8>" in caplog.text
    result = cairn.Trainer(_report, scaling_config=local, run_config=config).fit()
    assert result.error is None
    assert os.path.exists(os.path.join(os.fsencode(storage / "run"), b"notes\xe9.txt"))
