"""A run's own files read back as untrusted input, continued: a symbolic link loop planted
as one of them is damage (a FIFO there is, already), and a value nested deeper than any
writer or reader of it can take is refused where it is read, naming its file."""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from run_copies import copy_of_run, make_link_loop

import cairn
from cairn import ManifestError
from cairn._src.checkpoint.index import read_index
from cairn._src.cli.common import json_safe
from cairn._src.run import schema
from cairn._src.run.layout import INDEX_NAME, LEASE_NAME
from cairn._src.storage.location import resolve
from cairn._src.storage.retry import RetryPolicy

RETRY = RetryPolicy()
MANIFEST = "_cairn_manifest.json"
LOCAL = cairn.ScalingConfig(num_workers=0)


def _train(config: dict[str, Any]) -> None:
    start = cairn.get_checkpoint()
    first = 0
    if start is not None:
        with start.as_directory() as directory:
            first = int((Path(directory) / "step.txt").read_text()) + 1
    for step in range(first, first + config["steps"]):
        directory = Path(tempfile.mkdtemp())
        (directory / "step.txt").write_text(str(step))
        cairn.report({"step": step, **config.get("metrics", {})},
                     checkpoint=cairn.Checkpoint.from_directory(str(directory)))


def _fit(storage: Path, steps: int = 1, **config: Any) -> cairn.Result:
    return cairn.Trainer(_train, train_loop_config={"steps": steps, **config},
                         scaling_config=LOCAL,
                         run_config=cairn.RunConfig(
                             name="run", storage_path=str(storage),
                             failure_config=cairn.FailureConfig(max_failures=0))).fit()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    storage = tmp_path_factory.mktemp("links") / "storage"
    result = _fit(storage, steps=3)
    assert result.error is None
    return storage / "run"


@pytest.fixture
def run(pristine: Path, tmp_path: Path) -> Path:
    return copy_of_run(pristine, tmp_path)


def test_a_lease_that_is_a_link_loop_is_taken_over(run: Path) -> None:
    make_link_loop(run / LEASE_NAME)
    result = _fit(run.parent)
    assert result.error is None and result.metrics["step"] == 3
    assert not os.path.lexists(run / LEASE_NAME)  # replaced by the driver's, then released


def test_an_index_that_is_a_link_loop_is_rebuilt(
        run: Path, caplog: pytest.LogCaptureFixture) -> None:
    make_link_loop(run / INDEX_NAME)
    with pytest.raises(ManifestError, match=r"cairn_run\.json is a symbolic link loop"):
        read_index(resolve(str(run)), RETRY)
    with caplog.at_level(logging.WARNING):
        result = cairn.Result.from_path(str(run))
    assert [c.path.rsplit("/", 1)[1] for c, _ in result.best_checkpoints] == [
        "checkpoint_000001", "checkpoint_000002", "checkpoint_000003"]
    assert "cairn_run.json is a symbolic link loop" in caplog.text
    assert (run / INDEX_NAME).is_symlink()  # from_path only reads
    assert _fit(run.parent).metrics["step"] == 3  # fit() rebuilds it and writes it


def test_a_manifest_that_is_a_link_loop_is_damage_and_the_run_resumes_before_it(
        run: Path, caplog: pytest.LogCaptureFixture) -> None:
    make_link_loop(run / "checkpoint_000003" / MANIFEST)
    with caplog.at_level(logging.WARNING):
        result = _fit(run.parent)  # max_failures=0: an outage would fail it
    assert result.error is None
    assert result.metrics["step"] == 2  # resumed from checkpoint_000002 (step 1)
    assert "Not resuming from checkpoint_000003" in caplog.text
    assert "_cairn_manifest.json is a symbolic link loop" in caplog.text


def test_a_checkpoint_directory_that_is_a_link_loop_is_damage(
        run: Path, caplog: pytest.LogCaptureFixture) -> None:
    make_link_loop(run / "checkpoint_000003")
    with caplog.at_level(logging.WARNING):
        result = _fit(run.parent)
    assert result.error is None and result.metrics["step"] == 2
    assert f"cannot be reached: {run / 'checkpoint_000003'} is a symbolic link loop" \
        in caplog.text
    assert (run / "checkpoint_000003").is_symlink()  # the link is not the run's to delete


def _nested(depth: int) -> dict[str, Any]:
    """An object nested ``depth`` levels deep (``{}`` is one level)."""
    value: dict[str, Any] = {"loss": 0.5}
    for _ in range(depth - 1):
        value = {"k": value}
    return value


def _plant_metrics(run: Path, metrics: dict[str, Any]) -> None:
    index = json.loads((run / INDEX_NAME).read_text())
    index["checkpoints"][-1]["metrics"] = metrics
    (run / INDEX_NAME).write_text(json.dumps(index))


@pytest.fixture
def less_stack() -> Iterator[None]:
    """Half of Python's default recursion limit: what reads and writes a stored value
    keeps a margin of that much for the calls it runs nested in."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(500)
    try:
        yield
    finally:
        sys.setrecursionlimit(limit)


def test_every_depth_a_user_may_report_is_stored_and_re_encoded_with_margin(
        run: Path, less_stack: None) -> None:
    assert schema.MAX_USER_DEPTH < schema.MAX_STORED_DEPTH
    _plant_metrics(run, _nested(schema.MAX_STORED_DEPTH))
    index = read_index(resolve(str(run)), RETRY)
    assert index is not None
    again = json.loads(index.to_json())
    assert again["checkpoints"][-1]["metrics"] == _nested(schema.MAX_STORED_DEPTH)
    json.dumps(json_safe(again))


def test_a_planted_value_nested_deeper_than_stored_values_go_is_refused_naming_its_file(
        run: Path, caplog: pytest.LogCaptureFixture) -> None:
    _plant_metrics(run, _nested(500))
    with pytest.raises(ManifestError, match=(
            r"The run index .*cairn_run\.json is invalid: field 'checkpoints\[2\]\.metrics' "
            rf"is an object with 1 keys?; expected an object nested at most "
            rf"{schema.MAX_STORED_DEPTH} levels deep")):
        read_index(resolve(str(run)), RETRY)
    # fit() rebuilds the damaged index from the manifests and goes on, no RecursionError.
    with caplog.at_level(logging.WARNING):
        result = _fit(run.parent)
    assert result.error is None and result.metrics["step"] == 3
    assert "cairn_run.json is invalid" in caplog.text


def test_a_report_as_deep_as_users_may_nest_is_committed_and_read_back(tmp_path: Path) -> None:
    deep = _nested(schema.MAX_USER_DEPTH - 1)
    result = _fit(tmp_path, metrics={"deep": deep})
    assert result.error is None
    assert cairn.Result.from_path(str(tmp_path / "run")).metrics["deep"] == deep
