"""``UserCallback`` (Ray Train v2) and ``cairn.Callback`` hooks: called from the driver at
the right moments in real runs; a hook that raises fails the run with ControllerError."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import api_workloads
import pytest

import cairn
from cairn import (
    Checkpoint,
    ControllerError,
    FailureConfig,
    RunConfig,
    ScalingConfig,
    Trainer,
    TrainingFailedError,
    UserCallback,
    WorkerGroupError,
)
from cairn._src.config.run import ScalingConfig as _Scaling
from cairn._src.observe.callbacks import CallbackDispatcher, TrainRunContext


class Recorder(UserCallback):
    def __init__(self) -> None:
        self.reports: list[tuple[list[dict[str, Any]], Checkpoint | None]] = []
        self.exceptions: list[dict[int, BaseException]] = []
        self.contexts: list[TrainRunContext] = []

    def after_report(self, run_context: TrainRunContext, metrics: list[dict[str, Any]],
                     checkpoint: Checkpoint | None) -> None:
        self.contexts.append(run_context)
        self.reports.append((metrics, checkpoint))

    def after_exception(self, run_context: TrainRunContext,
                        worker_exceptions: dict[int, BaseException]) -> None:
        self.contexts.append(run_context)
        self.exceptions.append(worker_exceptions)


class CairnRecorder(cairn.Callback):
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def on_report(self, report_index: int, metrics: dict[str, Any]) -> None:
        self.events.append(("report", report_index))

    def on_checkpoint(self, dir_name: str, metrics: dict[str, Any]) -> None:
        self.events.append(("checkpoint", dir_name))

    def on_failure(self, error: BaseException) -> None:
        self.events.append(("failure", error))

    def on_run_end(self, result: cairn.Result) -> None:
        self.events.append(("end", result.error))


def test_after_report_in_report_order_with_each_ranks_metrics(tmp_path: Path) -> None:
    recorder, cairn_recorder = Recorder(), CairnRecorder()
    config = RunConfig(name="run", storage_path=str(tmp_path),
                       callbacks=[recorder, cairn_recorder])
    Trainer(api_workloads.mixed_reports, train_loop_config={"n": 1},
            scaling_config=ScalingConfig(num_workers=2), run_config=config).fit()
    steps = [[m["step"] for m in metrics] for metrics, _ in recorder.reports]
    assert steps == [[1, 1], [2, 2], [3, 3], [4, 4], [5, 5]]
    assert [[m["rank"] for m in metrics] for metrics, _ in recorder.reports] == [[0, 1]] * 5
    checkpoints = [c for _, c in recorder.reports]
    assert [c is None for c in checkpoints] == [True, False, True, False, True]
    sync, async_ = checkpoints[1], checkpoints[3]
    assert sync is not None and sync.path == str(tmp_path / "run" / "checkpoint_000002")
    assert api_workloads.load_dict(sync) == {"step": 2}
    assert async_ is not None and async_.path.endswith("checkpoint_000004")
    async_.verify()  # committed before the callback heard of it
    context = recorder.contexts[0]
    assert context.get_run_config() is config and context.train_loop_config == {"n": 1}
    assert context.scaling_config.num_workers == 2
    # cairn.Callback beside it: rank 0's reports, commits, then the end of the run.
    assert [e for e in cairn_recorder.events if e[0] == "report"] == [
        ("report", i) for i in range(1, 6)]
    assert [e for e in cairn_recorder.events if e[0] == "checkpoint"] == [
        ("checkpoint", "checkpoint_000002"), ("checkpoint", "checkpoint_000004")]
    assert cairn_recorder.events[-1] == ("end", None)


def test_after_exception_gets_each_failed_ranks_exception(tmp_path: Path) -> None:
    recorder, cairn_recorder = Recorder(), CairnRecorder()
    result = Trainer(
        api_workloads.fail_on_first_attempt, train_loop_config={"rank": 1},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="run", storage_path=str(tmp_path),
                             failure_config=FailureConfig(max_failures=1),
                             callbacks=[recorder, cairn_recorder]),
    ).fit()
    assert result.return_value == "finished"
    assert len(recorder.exceptions) == 1
    (failures,) = recorder.exceptions
    assert list(failures) == [1]
    assert isinstance(failures[1], ValueError) and str(failures[1]) == "rank 1 is broken"
    (failure,) = [e for kind, e in cairn_recorder.events if kind == "failure"]
    assert isinstance(failure, WorkerGroupError) and failure.worker_failures == failures
    # The failed attempt's report 1 completed on both ranks; the retry's report is report 2.
    assert [[m["step"] for m in metrics] for metrics, _ in recorder.reports][-1] == [0, 0]


class Exploding(UserCallback):
    def after_report(self, run_context: TrainRunContext, metrics: list[dict[str, Any]],
                     checkpoint: Checkpoint | None) -> None:
        raise KeyError("callback bug")


def test_a_callback_that_raises_fails_the_run_with_controller_error(tmp_path: Path) -> None:
    trainer = Trainer(
        api_workloads.fail_on_first_attempt, train_loop_config={"rank": -1},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="run", storage_path=str(tmp_path),
                             failure_config=FailureConfig(max_failures=3),
                             callbacks=[Exploding()]),
    )
    with pytest.raises(ControllerError, match=r"Training failed due to controller error:\n"
                       r"'callback bug'") as info:
        trainer.fit()
    assert isinstance(info.value, TrainingFailedError)
    assert isinstance(info.value.controller_failure, KeyError)
    again = pickle.loads(pickle.dumps(info.value))
    assert isinstance(again.controller_failure, KeyError) and str(again) == str(info.value)
    # The run's lease was released: the same run starts again.
    Trainer(api_workloads.fail_on_first_attempt, train_loop_config={"rank": -1},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(name="run", storage_path=str(tmp_path))).fit()


def _dispatcher(recorder: Recorder, world_size: int = 2) -> CallbackDispatcher:
    context = TrainRunContext(run_config=RunConfig(), train_loop_config=None,
                              scaling_config=_Scaling(num_workers=world_size))
    return CallbackDispatcher([recorder], context, world_size)


def test_dispatcher_waits_for_every_rank_and_for_the_commit() -> None:
    recorder = Recorder()
    dispatcher = _dispatcher(recorder)
    dispatcher.reported(0, 1, {"r": 0}, has_checkpoint=False)
    assert recorder.reports == []  # rank 1 has not reported 1 yet
    dispatcher.reported(1, 1, {"r": 1}, has_checkpoint=False)
    assert recorder.reports == [([{"r": 0}, {"r": 1}], None)]
    dispatcher.reported(0, 2, {"r": 0}, has_checkpoint=True)
    dispatcher.reported(1, 2, {"r": 1}, has_checkpoint=False)
    dispatcher.reported(0, 3, {"r": 0}, has_checkpoint=False)
    dispatcher.reported(1, 3, {"r": 1}, has_checkpoint=False)
    assert len(recorder.reports) == 1  # report 3 waits behind report 2's commit
    checkpoint = Checkpoint("/tmp/run/checkpoint_000002")
    dispatcher.committed(2, "checkpoint_000002", {"r": 0}, checkpoint)
    assert [c for _, c in recorder.reports] == [None, checkpoint, None]
    # A skipped checkpoint: its report is delivered without one.
    dispatcher.reported(0, 4, {"r": 0}, has_checkpoint=True)
    dispatcher.reported(1, 4, {"r": 1}, has_checkpoint=True)
    dispatcher.skipped(4)
    assert recorder.reports[-1] == ([{"r": 0}, {"r": 1}], None)
    dispatcher.skipped(4)  # the other rank's upload failed too: nothing more
    dispatcher.reported(0, 5, {"r": 0}, has_checkpoint=False)
    dispatcher.reported(1, 5, {"r": 1}, has_checkpoint=False)
    assert len(recorder.reports) == 5


def test_dispatcher_drops_reports_of_a_failed_attempt() -> None:
    recorder = Recorder()
    dispatcher = _dispatcher(recorder)
    dispatcher.reported(0, 1, {"r": 0}, has_checkpoint=False)
    dispatcher.failed(WorkerGroupError("[rank 1] died", {1: RuntimeError("died")}))
    assert recorder.exceptions == [{1: recorder.exceptions[0][1]}]
    dispatcher.reported(0, 1, {"r": 0}, has_checkpoint=False)
    dispatcher.reported(1, 1, {"r": 1}, has_checkpoint=False)
    assert recorder.reports == [([{"r": 0}, {"r": 1}], None)]
