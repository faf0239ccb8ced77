"""``Result.from_path`` of a run whose index is damaged reads the run as ``fit()`` would:
the index rebuilt from the checkpoint manifests, with a warning, and nothing written."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import api_workloads
import pytest

from cairn import CheckpointConfig, Result, RunConfig, RunNotFoundError, ScalingConfig, Trainer

# Ranked by metric_a, worst to best, the kept checkpoints are not in report order.
SCORES = {"0": 9, "1": 1, "2": 5, "3": 0, "4": 7}
CONFIG = CheckpointConfig(num_to_keep=3, checkpoint_score_attribute="metric_a",
                          checkpoint_score_order="max")
REBUILT = ("Reading the run from its checkpoint manifests instead, in memory "
           "(Result.from_path writes nothing).")
REPORT_ORDER = ("The run's retention settings were in that index, so best_checkpoints are "
                "in report order (pass checkpoint_config to rank them).")


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Result]:
    """A run fit() finished, and the result fit() returned."""
    storage = tmp_path_factory.mktemp("finished")
    trainer = Trainer(api_workloads.scored_checkpoints,
                      train_loop_config={"iterations": 5, "scores": SCORES},
                      scaling_config=ScalingConfig(num_workers=2),
                      run_config=RunConfig(name="run", storage_path=str(storage),
                                           checkpoint_config=CONFIG))
    return storage / "run", trainer.fit()


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every entry under ``root`` by relative path: a file's bytes, None for a directory."""
    entries: dict[str, bytes | None] = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs:
            entries[os.path.relpath(os.path.join(directory, name), root)] = None
        for name in files:
            path = os.path.join(directory, name)
            entries[os.path.relpath(path, root)] = Path(path).read_bytes()
    return entries


def kept(result: Result) -> list[tuple[str, dict[str, Any]]]:
    """``best_checkpoints`` as (directory name, metrics), each checked to lie in the run."""
    for checkpoint, _ in result.best_checkpoints:
        assert Path(checkpoint.path).parent == Path(result.path)
    return [(Path(checkpoint.path).name, metrics)
            for checkpoint, metrics in result.best_checkpoints]


def wrong_json_types(body: dict[str, Any]) -> bytes:
    body["checkpoints"][1]["report_index"] = str(body["checkpoints"][1]["report_index"])
    return json.dumps(body).encode()


def conflicting_record(body: dict[str, Any]) -> bytes:
    body["checkpoints"][0].update(target_uri="s3://bucket/ckpt", target_path="/data/ckpt",
                                  managed=False)
    return json.dumps(body).encode()


def not_json(body: dict[str, Any]) -> bytes:
    return b"<html><body>503 Service Unavailable</body></html>\n"


@pytest.mark.parametrize(("damage", "why"), [
    (wrong_json_types, r"is invalid: field 'checkpoints\[1\]\.report_index' is '\d+' \(str\); "
                       r"expected"),
    (conflicting_record, r"is invalid: .*target_uri='s3://bucket/ckpt'.*"
                         r"target_path='/data/ckpt' are both set"),
    (not_json, r"is not valid JSON"),
], ids=["wrong_json_types", "conflicting_record", "not_json"])
def test_a_damaged_index_is_rebuilt_in_memory_and_nothing_is_written(
        finished: tuple[Path, Result], tmp_path: Path, caplog: pytest.LogCaptureFixture,
        damage: Callable[[dict[str, Any]], bytes], why: str) -> None:
    original, by_fit = finished
    root = tmp_path / "run"
    shutil.copytree(original, root)
    index_file = root / "cairn_run.json"
    index_file.write_bytes(damage(json.loads(index_file.read_bytes())))
    before = snapshot(root)

    with caplog.at_level(logging.WARNING, logger="cairn"):
        ranked = Result.from_path(root, checkpoint_config=CONFIG)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].startswith(f"The run index {index_file} ")
    assert REBUILT in warnings[0] and REPORT_ORDER not in warnings[0]
    assert re.search(why, warnings[0]), warnings[0]

    # As fit() returned it: the same kept checkpoints, ranked the same, the same latest.
    assert kept(ranked) == kept(by_fit) and len(kept(ranked)) == 3
    assert [metrics["metric_a"] for _, metrics in kept(ranked)] == [5, 7, 9]
    assert ranked.checkpoint is not None and by_fit.checkpoint is not None
    assert Path(ranked.checkpoint.path) == root / Path(by_fit.checkpoint.path).name
    assert ranked.metrics == by_fit.metrics and ranked.error is None

    # Without a checkpoint config the retention settings are lost with the index.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="cairn"):
        unranked = Result.from_path(root)
    assert REPORT_ORDER in caplog.text and str(index_file) in caplog.text
    assert kept(unranked) == sorted(kept(by_fit), key=lambda pair: -pair[1]["metric_b"])
    assert [metrics["metric_a"] for _, metrics in kept(unranked)] == [9, 5, 7]
    assert unranked.checkpoint is not None
    assert unranked.checkpoint.path == ranked.checkpoint.path

    # Read-only: no file changed, none added (no lease, no index written back).
    assert snapshot(root) == before


def test_a_lost_index_of_a_run_that_committed_is_rebuilt_in_memory(
        finished: tuple[Path, Result], tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    original, by_fit = finished
    root = tmp_path / "run"
    shutil.copytree(original, root)
    (root / "cairn_run.json").unlink()
    before = snapshot(root)
    with caplog.at_level(logging.WARNING, logger="cairn"):
        ranked = Result.from_path(root, checkpoint_config=CONFIG)
    assert "has no run index, but its event log records commits" in caplog.text
    assert kept(ranked) == kept(by_fit)
    assert snapshot(root) == before
    # A directory that never committed anything is still no run.
    (tmp_path / "empty" / "events").mkdir(parents=True)
    with pytest.raises(RunNotFoundError, match=r"cairn_run\.json doesn't exist"):
        Result.from_path(tmp_path / "empty")
