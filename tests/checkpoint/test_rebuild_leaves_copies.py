"""A run index rebuilt from the manifests (`cairn rebuild-index`, ``fit()`` on a damaged
or lost index, ``Result.from_path``) leaves out a user's copy of a checkpoint inside the
run directory, manifest included, as the start-up reconcile does: it is not the run's, so
retention never deletes it with the user's own files (contract item 13).

Real runs through ``cairn.Trainer`` with a real worker process, on local storage.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_reconcile_copies import _contents, _fit, _indexed, _put

import cairn
from cairn._src.checkpoint.manifest import MANIFEST_NAME
from cairn._src.run.layout import INDEX_NAME
from cairn._src.storage.location import StorageLocation, resolve
from cairn._src.storage.retry import RetryPolicy

RETRY = RetryPolicy()
# Retention that keeps the best two by loss: reports 4 to 6 drop everything before them.
KEEP = {"num_to_keep": 2, "checkpoint_score_attribute": "loss",
        "checkpoint_score_order": "min"}
COPY_WARNING = ("Skipping best_backup while rebuilding the index: its manifest is of report "
                "3, but this run writes the checkpoint of report 3 only to checkpoint_000003 "
                "or to a name its event log records before the upload")


def _copy(run: StorageLocation, source: str, copy: str) -> dict[str, bytes]:
    """The user's copy of ``<run>/<source>`` (manifest included) with notes of their own,
    in ``<run>/<copy>``; what it holds."""
    for rel, data in _contents(run.join(source)).items():
        _put(run.join(copy), rel, data)
    _put(run.join(copy), "NOTES.txt", b"my notes")
    contents = _contents(run.join(copy))
    assert MANIFEST_NAME in contents
    return contents


def _damage_index(storage: str, how: str) -> None:
    path = os.path.join(storage, "run", INDEX_NAME)
    if how == "lost":
        os.remove(path)
    else:
        with open(path, "w", encoding="utf-8") as f:
            f.write('{"torn')


def test_cairn_rebuild_index_leaves_a_copy_out_and_retention_leaves_it(
        tmp_path: Path, scratch: str, caplog: pytest.LogCaptureFixture) -> None:
    storage = str(tmp_path / "storage")
    _fit(storage, scratch, 3, **KEEP)
    run = resolve(storage).join("run")
    backup = _copy(run, "checkpoint_000003", "best_backup")
    _damage_index(storage, "torn")

    done = subprocess.run([sys.executable, "-m", "cairn", "rebuild-index", run.path],
                          capture_output=True, text=True, timeout=120)

    assert done.returncode == 0, done.stderr
    assert _indexed(run) == ["checkpoint_000002", "checkpoint_000003"]
    assert done.stdout.endswith("2 checkpoints\n")
    assert COPY_WARNING in done.stderr
    assert done.stderr.count("best_backup") == 1

    with caplog.at_level(logging.WARNING):
        _fit(storage, scratch, 6, **KEEP)  # reports 4 to 6: retention deletes
    assert _contents(run.join("best_backup")) == backup
    assert _indexed(run) == ["checkpoint_000005", "checkpoint_000006"]


@pytest.mark.parametrize("how", ["torn", "lost"])
def test_fit_on_a_damaged_index_leaves_a_copy_out_and_in_place(
        how: str, tmp_path: Path, scratch: str, caplog: pytest.LogCaptureFixture) -> None:
    storage = str(tmp_path / "storage")
    _fit(storage, scratch, 3, **KEEP)
    run = resolve(storage).join("run")
    backup = _copy(run, "checkpoint_000003", "best_backup")
    _damage_index(storage, how)

    with caplog.at_level(logging.WARNING):
        result = _fit(storage, scratch, 6, **KEEP)  # reports 4 to 6: retention deletes

    assert result.error is None
    assert _contents(run.join("best_backup")) == backup
    assert _indexed(run) == ["checkpoint_000005", "checkpoint_000006"]
    assert COPY_WARNING in caplog.text
    assert [c.path.rsplit("/", 1)[1] for c, _ in result.best_checkpoints] == [
        "checkpoint_000005", "checkpoint_000006"]


def test_result_from_path_on_a_damaged_index_lists_no_copy(
        tmp_path: Path, scratch: str, caplog: pytest.LogCaptureFixture) -> None:
    storage = str(tmp_path / "storage")
    # An explicit name, announced in the event log before its upload: the run's own.
    _fit(storage, scratch, 3, {"2": "epoch-2"})
    run = resolve(storage).join("run")
    backup = _copy(run, "checkpoint_000002", "best_backup")
    copy = _copy(run, "epoch-2", "epoch-2-copy")
    _damage_index(storage, "torn")

    with caplog.at_level(logging.WARNING):
        result = cairn.Result.from_path(run.path)

    assert [c.path.rsplit("/", 1)[1] for c, _ in result.best_checkpoints] == [
        "checkpoint_000001", "checkpoint_000002", "epoch-2"]
    assert result.checkpoint is not None and result.checkpoint.path.endswith("/epoch-2")
    assert ("Skipping best_backup while rebuilding the index: its manifest is of report 2"
            in caplog.text)
    assert ("Skipping epoch-2-copy while rebuilding the index: its manifest is of report 3"
            in caplog.text)
    assert _contents(run.join("best_backup")) == backup
    assert _contents(run.join("epoch-2-copy")) == copy
