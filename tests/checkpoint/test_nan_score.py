"""A report whose checkpoint_score_attribute is NaN (a diverged fp16 step's loss) is
accepted, as Ray Train 2.60 accepts it: the checkpoint is committed and ranks as the worst
in both orders (num_to_keep drops it first, it is never the best), one warning names it,
and a driver restart reading the scores back from the index ranks them the same way.

Real runs through ``cairn.Trainer`` with one real worker process, on local storage.
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

import cairn
from cairn import Checkpoint, CheckpointConfig
from cairn._src.checkpoint.index import read_index
from cairn._src.run.layout import INDEX_NAME
from cairn._src.storage.location import resolve
from cairn._src.storage.retry import RetryPolicy

NAN = float("nan")


def _train(config: dict[str, Any]) -> None:
    """One checkpoint per loss of ``losses``, resuming after the step it restores."""
    start = 0
    resumed = cairn.get_checkpoint()
    if resumed is not None:
        with resumed.as_directory() as directory:
            with open(os.path.join(directory, "step"), encoding="utf-8") as f:
                start = int(f.read()) + 1
    for step in range(start, len(config["losses"])):
        directory = tempfile.mkdtemp(dir=config["scratch"])
        with open(os.path.join(directory, "step"), "w", encoding="utf-8") as f:
            f.write(str(step))
        cairn.report({"loss": config["losses"][step], "step": step},
                     checkpoint=Checkpoint.from_directory(directory))


def _checkpoint_config(order: str) -> CheckpointConfig:
    return CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="loss",
                            checkpoint_score_order=order)  # type: ignore[arg-type]


def _fit(storage: str, scratch: str, losses: list[float], order: str) -> cairn.Result:
    return cairn.Trainer(
        _train, train_loop_config={"losses": losses, "scratch": scratch},
        scaling_config=cairn.ScalingConfig(num_workers=1),
        run_config=cairn.RunConfig(name="run", storage_path=storage,
                                   checkpoint_config=_checkpoint_config(order),
                                   failure_config=cairn.FailureConfig(max_failures=0)),
    ).fit()


def _names(result: cairn.Result) -> list[str]:
    """``best_checkpoints`` (worst to best) by directory name."""
    return [os.path.basename(c.path) for c, _ in result.best_checkpoints]


def _nan_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "is NaN" in r.getMessage()]


# order -> best_checkpoints of the run reporting 3.0, NaN, 1.0 (worst to best).
KEPT = {"min": ["checkpoint_000001", "checkpoint_000003"],
        "max": ["checkpoint_000003", "checkpoint_000001"]}


@pytest.mark.parametrize("order", ["min", "max"])
def test_a_nan_score_is_committed_ranks_worst_and_is_dropped_first(
        order: str, tmp_path: Path, scratch: str, caplog: pytest.LogCaptureFixture) -> None:
    storage = str(tmp_path / "storage")
    with caplog.at_level(logging.WARNING, logger="cairn"):
        result = _fit(storage, scratch, [3.0, NAN, 1.0], order)

    assert result.error is None
    # Report 2 committed (the run went on to report 3), then dropped first by num_to_keep=2,
    # in both orders: a NaN ranks below every number.
    assert _names(result) == KEPT[order]
    run = os.path.join(storage, "run")
    assert not os.path.exists(os.path.join(run, "checkpoint_000002"))
    best = result.get_best_checkpoint("loss", order)
    assert best is not None and os.path.basename(best.path) == KEPT[order][-1]
    [warning] = _nan_warnings(caplog)
    assert "'loss'" in warning and "checkpoint_000002 (report 2)" in warning


@pytest.mark.parametrize("order", ["min", "max"])
def test_a_driver_restart_reads_the_nan_score_back_and_ranks_it_the_same(
        order: str, tmp_path: Path, scratch: str) -> None:
    storage = str(tmp_path / "storage")
    first = _fit(storage, scratch, [3.0, NAN], order)

    # The NaN checkpoint is the latest, so kept; it ranks worst and is never the best.
    assert _names(first) == ["checkpoint_000002", "checkpoint_000001"]
    best = first.get_best_checkpoint("loss", order)
    assert best is not None and os.path.basename(best.path) == "checkpoint_000001"
    run = os.path.join(storage, "run")
    with open(os.path.join(run, INDEX_NAME), encoding="utf-8") as f:
        assert '"loss": NaN' in f.read()  # JSON's NaN token, which json.loads reads back
    index = read_index(resolve(run), RetryPolicy())
    assert index is not None
    scores = {r.dir_name: r.metrics["loss"] for r in index.checkpoints}
    assert scores["checkpoint_000001"] == 3.0 and math.isnan(scores["checkpoint_000002"])
    loaded = cairn.Result.from_path(run, checkpoint_config=_checkpoint_config(order))
    assert _names(loaded) == _names(first)

    # A new driver resumes from the NaN checkpoint (the latest, as Ray Train does), reads
    # its score back from the index, and drops it first at the next commit.
    second = _fit(storage, scratch, [3.0, NAN, 1.0], order)

    assert second.error is None
    assert _names(second) == KEPT[order]
    assert [m["step"] for _, m in second.best_checkpoints] == (
        [0, 2] if order == "min" else [2, 0])
    assert not os.path.exists(os.path.join(run, "checkpoint_000002"))
    loaded = cairn.Result.from_path(run, checkpoint_config=_checkpoint_config(order))
    assert _names(loaded) == KEPT[order]
