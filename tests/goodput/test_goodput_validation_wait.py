"""Once the train function has returned on every rank, the time the driver waits for its
validations is validation wait, not productive training: in ``Result.goodput``, in the
timeline of ``cairn goodput -o`` and in the live view, which agree. The parts still add
up to the wall time, also after failures and driver restarts."""

from __future__ import annotations

import json
import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import cairn
from cairn import Checkpoint, ScalingConfig, Trainer
from cairn._src.controller.validations import ValidationRunner
from cairn._src.goodput.summary import GoodputSummary, summarize
from cairn._src.goodput.timeline import CATEGORIES, build_timeline
from cairn._src.observe.live_state import LiveState
from cairn._src.run.layout import EVENTS_DIR

RunConfigFactory = Callable[..., cairn.RunConfig]
Record = dict[str, Any]

# Set once the driver waits for its validations at the end of fit(): the validation
# function (in the driver, the test's process) finishes only then, so the wait is certain
# (a file the train function writes as its last act would not do: the driver may read
# the rank's return only after the validation finished).
DRIVER_WAITS = threading.Event()


@pytest.fixture(autouse=True)
def _driver_waits(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    DRIVER_WAITS.clear()
    original = ValidationRunner.wait_idle

    def wait_idle(self: ValidationRunner) -> None:
        DRIVER_WAITS.set()
        original(self)

    monkeypatch.setattr(ValidationRunner, "wait_idle", wait_idle)
    yield
    DRIVER_WAITS.set()


def validate_once_the_driver_waits(checkpoint: Checkpoint) -> dict[str, Any]:
    if not DRIVER_WAITS.wait(timeout=120):
        raise TimeoutError("the driver never waited for its validations")
    return {"val_score": 1.0}


def report_one_checkpoint(config: dict[str, Any]) -> None:
    directory = tempfile.mkdtemp()
    with open(os.path.join(directory, "weights"), "w") as f:
        f.write("w")
    cairn.report({"step": 0}, checkpoint=Checkpoint.from_directory(directory),
                 validation=config["validate"])


def _parts(summary: GoodputSummary) -> float:
    return (summary.productive_s + summary.startup_s + summary.checkpoint_blocked_s
            + summary.recovery_s + summary.lost_work_s + summary.validation_wait_s)


def _logged(run: Path, kind: str) -> list[Record]:
    records = [json.loads(line) for segment in sorted((run / EVENTS_DIR).iterdir())
               for line in segment.read_text().splitlines() if line.strip()]
    return [r for r in records if r["type"] == kind]


def test_the_wait_for_validations_after_training_is_not_productive(
    run_config: RunConfigFactory,
) -> None:
    config = run_config()
    result = Trainer(report_one_checkpoint, train_loop_config={"validate": True},
                     scaling_config=ScalingConfig(num_workers=1), run_config=config,
                     validation_config=cairn.ValidationConfig(
                         validate_once_the_driver_waits)).fit()
    run = Path(os.fspath(config.storage_path)) / "run"
    [returned] = _logged(run, "train_end")
    [validated] = _logged(run, "validation_finished")
    assert validated["status"] == "VALIDATED"
    goodput = result.goodput
    # From the train function's return to the validation's end, as the log has them.
    assert goodput.validation_wait_s > 0
    assert goodput.validation_wait_s == pytest.approx(validated["t"] - returned["t"])
    assert _parts(goodput) == pytest.approx(goodput.wall_s)
    assert 0.0 <= goodput.goodput <= 1.0
    assert goodput.as_dict()["validation_wait_s"] == goodput.validation_wait_s
    assert "validation wait" in goodput.format()
    assert goodput == cairn.Result.from_path(str(run)).goodput


def test_a_run_without_validations_has_no_validation_wait(
    run_config: RunConfigFactory,
) -> None:
    config = run_config()
    result = Trainer(report_one_checkpoint, train_loop_config={"validate": False},
                     scaling_config=ScalingConfig(num_workers=1), run_config=config).fit()
    run = Path(os.fspath(config.storage_path)) / "run"
    assert len(_logged(run, "train_end")) == 1
    goodput = result.goodput
    assert goodput.validation_wait_s == 0.0
    assert _parts(goodput) == pytest.approx(goodput.wall_s)


# --- the same accounting from hand-made logs (pure logic) ---------------------------------

WAITED: list[Record] = [
    {"type": "session_start", "t": 0.0},
    {"type": "attempt_start", "attempt": 0, "t": 0.0},
    {"type": "train_start", "attempt": 0, "t": 1.0},
    {"type": "commit", "index": 1, "t": 3.0},
    {"type": "blocked", "rank": 0, "seconds": 0.5, "t": 3.0},
    # Finished while the train function still ran: no wait.
    {"type": "validation_finished", "dir_name": "checkpoint_000001", "t": 4.0},
    {"type": "commit", "index": 2, "t": 5.0},
    {"type": "train_end", "attempt": 0, "t": 6.0},
    {"type": "validation_finished", "dir_name": "checkpoint_000002", "t": 9.0},
    {"type": "session_end", "t": 9.5, "status": "finished"},
]

# A driver killed while it waited, and the next one, which validates again.
DRIVER_DIED_WHILE_WAITING: list[Record] = [
    {"type": "session_start", "t": 0.0},
    {"type": "attempt_start", "attempt": 0, "t": 0.0},
    {"type": "train_start", "attempt": 0, "t": 1.0},
    {"type": "commit", "index": 1, "t": 3.0},
    {"type": "train_end", "attempt": 0, "t": 5.0},
    {"type": "validation_finished", "dir_name": "checkpoint_000000", "t": 7.0},
    {"type": "session_start", "t": 10.0},
    {"type": "attempt_start", "attempt": 1, "t": 10.0},
    {"type": "train_start", "attempt": 1, "t": 11.0},
    {"type": "train_end", "attempt": 1, "t": 12.0},
    {"type": "validation_finished", "dir_name": "checkpoint_000001", "t": 13.0},
    {"type": "session_end", "t": 14.0, "status": "finished"},
]

# Every rank returned, then the attempt failed (its last commit did): the work after the
# commit before is lost work, the wait before that commit is still a wait.
FAILED_AFTER_TRAINING: list[Record] = [
    {"type": "session_start", "t": 0.0},
    {"type": "attempt_start", "attempt": 0, "t": 0.0},
    {"type": "train_start", "attempt": 0, "t": 1.0},
    {"type": "train_end", "attempt": 0, "t": 4.0},
    {"type": "commit", "index": 1, "t": 5.0},
    {"type": "validation_finished", "dir_name": "checkpoint_000001", "t": 7.0},
    {"type": "failure", "attempt": 0, "t": 8.0, "ranks": [0], "reason": "x",
     "last_commit_t": 5.0},
    {"type": "attempt_start", "attempt": 1, "t": 8.5},
    {"type": "train_start", "attempt": 1, "t": 9.0},
    {"type": "train_end", "attempt": 1, "t": 10.0},
    {"type": "session_end", "t": 11.0, "status": "finished"},
]


def _assert_agree(events: list[Record]) -> GoodputSummary:
    """The summary and the timeline of the one rank count each second once, alike."""
    summary = summarize(events)
    lanes = [lane for lane in build_timeline(events).lanes if lane.rank in (0, None)]
    seconds = {c: sum(lane.seconds(c) for lane in lanes) for c in CATEGORIES}
    assert sum(seconds.values()) == pytest.approx(summary.wall_s)
    assert seconds["validation_wait"] == pytest.approx(summary.validation_wait_s)
    assert seconds["checkpoint_stall"] == pytest.approx(summary.checkpoint_blocked_s)
    assert seconds["lost_work"] == pytest.approx(summary.lost_work_s)
    assert seconds["training"] == pytest.approx(summary.productive_s)
    assert _parts(summary) == pytest.approx(summary.wall_s)
    assert 0.0 <= summary.goodput <= 1.0
    return summary


def test_the_wait_runs_from_the_return_to_the_last_validation_after_it() -> None:
    summary = _assert_agree(WAITED)
    assert summary.validation_wait_s == pytest.approx(3.0)  # 6 to 9
    assert summary.productive_s == pytest.approx(9.5 - 1.0 - 0.5 - 3.0)
    lane = build_timeline(WAITED).lanes[0]
    assert [(i.start, i.end, i.category) for i in lane.intervals][-2:] == [
        (6.0, 9.0, "validation_wait"), (9.0, 9.5, "training")]


def test_each_driver_counts_its_own_wait() -> None:
    summary = _assert_agree(DRIVER_DIED_WHILE_WAITING)
    assert summary.wall_s == pytest.approx(7.0 + 4.0)
    assert summary.validation_wait_s == pytest.approx(2.0 + 1.0)


def test_lost_work_after_the_return_is_counted_once() -> None:
    summary = _assert_agree(FAILED_AFTER_TRAINING)
    assert summary.lost_work_s == pytest.approx(3.0)  # 5 to 8
    assert summary.validation_wait_s == pytest.approx(1.0)  # 4 to 5; none in attempt 1
    assert summary.recovery_s == pytest.approx(1.0)


def test_a_log_without_train_end_has_no_validation_wait() -> None:
    older = [e for e in WAITED if e["type"] != "train_end"]
    summary = _assert_agree(older)
    assert summary.validation_wait_s == 0.0
    assert summary.productive_s == pytest.approx(9.5 - 1.0 - 0.5)


def test_the_live_view_counts_the_wait_as_the_summary_does() -> None:
    state = LiveState(1, started_at=0.0)
    log: list[Record] = [{"type": "session_start", "t": 0.0}]
    state.on_attempt_start(0, 0.0, None)
    state.on_train_start(1.0)
    state.on_committed(1, "checkpoint_000001", 0, 0.1, 3.0, True)
    state.on_train_end(4.0)
    log += [{"type": "attempt_start", "attempt": 0, "t": 0.0},
            {"type": "train_start", "attempt": 0, "t": 1.0},
            {"type": "commit", "index": 1, "t": 3.0, "bytes": 0},
            {"type": "train_end", "attempt": 0, "t": 4.0}]
    # Still waiting at 6: the wait so far is not training.
    waiting = summarize([*log, {"type": "validation_finished", "t": 6.0},
                         {"type": "session_end", "t": 6.0}])
    assert waiting.validation_wait_s == pytest.approx(2.0)
    assert state.goodput(6.0).validation_wait_s == pytest.approx(2.0)
    assert state.goodput_share(6.0) == pytest.approx(waiting.goodput)
    state.on_validation_finished("checkpoint_000001", "VALIDATED", 7.0)
    log += [{"type": "validation_finished", "dir_name": "checkpoint_000001", "t": 7.0},
            {"type": "session_end", "t": 8.0}]
    assert state.goodput_share(8.0) == pytest.approx(summarize(log).goodput)
    assert state.goodput(8.0).validation_wait_s == pytest.approx(3.0)
