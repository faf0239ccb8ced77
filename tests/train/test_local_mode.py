"""Local mode, ScalingConfig(num_workers=0): the train function runs in the driver's own
process, on the thread that called fit(), and the run is committed as any other."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import cairn
from cairn import (
    Checkpoint,
    ConfigError,
    FailureConfig,
    RetryPolicy,
    ScalingConfig,
    Trainer,
    TrainingFailedError,
)
from cairn._src.backends.in_process import STOP_SIGNAL, InProcessWorker, TrainFunctionStopped
from cairn._src.checkpoint.manifest import read_manifest
from cairn._src.cli.main import main as cli_main
from cairn._src.errors import RunLeaseError
from cairn._src.run.events import read_events
from cairn._src.run.layout import LEASE_NAME
from cairn._src.run.status import run_history
from cairn._src.storage.location import resolve
from cairn._src.wire.bootstrap import Bootstrap
from cairn.collective import barrier, broadcast_from_rank_zero

RunConfigFactory = Callable[..., cairn.RunConfig]
LOCAL = ScalingConfig(num_workers=0)
# Threads that ran before the test (a peer server an earlier unit test in this process
# started runs until the process ends): the run's own must be gone when fit() returns.
_EARLIER: set[threading.Thread] = set()


@pytest.fixture(autouse=True)
def _threads_before() -> None:
    _EARLIER.clear()
    _EARLIER.update(threading.enumerate())


def cairn_threads() -> list[str]:
    """The names of Cairn's threads still running that the test's runs started."""
    return [t.name for t in threading.enumerate()
            if t.name.startswith("cairn") and t not in _EARLIER]


def save_step(step: int, **metrics: Any) -> None:
    """Report ``step`` with a checkpoint holding it."""
    with tempfile.TemporaryDirectory() as directory:
        Path(directory, "step").write_text(str(step))
        cairn.report({"step": step, **metrics}, checkpoint=Checkpoint.from_directory(directory))


def restored_step() -> int:
    """The step of get_checkpoint(), -1 without one."""
    checkpoint = cairn.get_checkpoint()
    if checkpoint is None:
        return -1
    with checkpoint.as_directory() as directory:
        return int(Path(directory, "step").read_text())


def counting(config: dict[str, Any]) -> dict[str, Any]:
    """Steps on from the restored checkpoint, one checkpoint per step (used by both the
    local-mode run and a run with worker processes)."""
    first = restored_step() + 1
    for step in range(first, first + config["steps"]):
        save_step(step)
    context = cairn.get_context()
    return {"first": first, "world": (context.get_world_rank(), context.get_world_size()),
            "pid": os.getpid()}


def test_the_train_function_runs_on_the_calling_thread_and_commits_like_any_run(
        run_config: RunConfigFactory) -> None:
    seen: list[Any] = []
    box = {"config": {"steps": 3}}

    def train(config: dict[str, Any]) -> object:
        context = cairn.get_context()
        seen.append((threading.current_thread() is threading.main_thread(), os.getpid(),
                     context.get_world_rank(), context.get_world_size(),
                     context.get_local_rank(), context.get_local_world_size(),
                     context.get_node_rank(), context.get_experiment_name(),
                     config is box["config"], cairn.get_checkpoint()))
        for step in range(config["steps"]):
            save_step(step, loss=1.0 / (step + 1))
        return box

    config = run_config()
    result = Trainer(train, train_loop_config=box["config"], scaling_config=LOCAL,
                     run_config=config).fit()
    # The driver's own objects, its process and its main thread, rank 0 of 1.
    assert seen == [(True, os.getpid(), 0, 1, 0, 1, 0, "run", True, None)]
    assert result.return_value is box
    assert result.error is None
    assert result.metrics == {"step": 2, "loss": pytest.approx(1 / 3)}
    run = Path(config.storage_path, "run")
    assert result.path == str(run)
    assert result.checkpoint is not None and result.checkpoint.path.endswith("checkpoint_000003")
    for index in (1, 2, 3):
        manifest = read_manifest(resolve(str(run / f"checkpoint_{index:06d}")))
        assert manifest.report_index == index and "step" in manifest.files
    assert list(result.metrics_dataframe["step"]) == [0, 1, 2]
    # Nothing of the run is left behind in the driver: report() is a worker's call again.
    assert cairn_threads() == []
    with pytest.raises(cairn.ReportError, match=r"called outside a Cairn worker"):
        cairn.report({"after": 1})


def test_what_cannot_be_pickled_runs_in_local_mode_and_is_refused_with_workers(
        run_config: RunConfigFactory) -> None:
    # Nothing travels to a worker in local mode (as in Ray's): the function may close over
    # a lock and its config hold a queue; with worker processes both are named at once.
    lock, results = threading.Lock(), queue.Queue[int]()

    def train(config: dict[str, Any]) -> None:
        with lock:
            config["results"].put(7)
        cairn.report({"step": 1})

    Trainer(train, train_loop_config={"results": results}, scaling_config=LOCAL,
            run_config=run_config()).fit()
    assert results.get_nowait() == 7
    with pytest.raises(ConfigError, match=r"train_loop_per_worker.*cannot be pickled"):
        Trainer(train, train_loop_config={"results": results},
                scaling_config=ScalingConfig(num_workers=1), run_config=run_config())


def test_a_run_with_workers_resumes_from_a_local_mode_run_and_back(
        run_config: RunConfigFactory) -> None:
    config = run_config()
    local = Trainer(counting, train_loop_config={"steps": 2}, scaling_config=LOCAL,
                    run_config=config).fit()
    assert local.return_value["first"] == 0 and local.return_value["pid"] == os.getpid()
    workers = Trainer(counting, train_loop_config={"steps": 2},
                      scaling_config=ScalingConfig(num_workers=2), run_config=config).fit()
    # Both ranks resumed from the local-mode run's last checkpoint (step 1).
    assert workers.return_value["first"] == 2 and workers.return_value["world"] == (0, 2)
    assert workers.return_value["pid"] != os.getpid()
    again = Trainer(counting, train_loop_config={"steps": 1}, scaling_config=LOCAL,
                    run_config=config).fit()
    assert again.return_value["first"] == 4
    assert again.checkpoint is not None and again.checkpoint.path.endswith("checkpoint_000005")


def test_a_failure_restarts_in_the_driver_and_resumes_from_the_committed_checkpoint(
        run_config: RunConfigFactory) -> None:
    attempts: list[tuple[int, int]] = []

    def train() -> None:
        first = restored_step() + 1
        attempts.append((cairn.get_context().get_attempt(), first))
        for step in range(first, 4):
            save_step(step)
            if step == 1 and len(attempts) == 1:
                raise RuntimeError("boom at step 1")

    result = Trainer(train, scaling_config=LOCAL,
                     run_config=run_config(failure_config=FailureConfig(max_failures=1))).fit()
    assert attempts == [(0, 0), (1, 2)]
    assert result.metrics == {"step": 3}
    assert cairn_threads() == []


def test_a_failure_beyond_the_budget_raises_the_train_functions_error(
        run_config: RunConfigFactory) -> None:
    def train() -> None:
        save_step(0)
        raise ValueError("bad batch")

    with pytest.raises(TrainingFailedError, match=r"ValueError: bad batch") as info:
        Trainer(train, scaling_config=LOCAL, run_config=run_config()).fit()
    assert isinstance(info.value, cairn.WorkerGroupError)
    assert isinstance(info.value.worker_failures[0], ValueError)
    result = cairn.Result.from_path(str(Path(run_config().storage_path, "run")))
    assert result.checkpoint is not None and result.checkpoint.path.endswith("checkpoint_000001")


def test_ctrl_c_in_the_train_function_ends_the_run_without_a_restart(
        run_config: RunConfigFactory) -> None:
    calls: list[int] = []

    def train() -> None:
        calls.append(1)
        save_step(0)
        raise KeyboardInterrupt

    config = run_config(failure_config=FailureConfig(max_failures=3))
    with pytest.raises(KeyboardInterrupt):
        Trainer(train, scaling_config=LOCAL, run_config=config).fit()
    assert calls == [1]
    events = read_events(resolve(str(Path(config.storage_path, "run", "events"))),
                         RetryPolicy())
    history = run_history(events)
    # Ended as Ctrl-C ends a run with workers: interrupted, and no failure counted.
    assert (history.status, history.attempts, history.failures) == ("interrupted", 1, ())
    assert cairn_threads() == []
    # The run continues from its committed checkpoint, as after Ctrl-C with workers.
    assert Trainer(counting, train_loop_config={"steps": 1}, scaling_config=LOCAL,
                   run_config=config).fit().return_value["first"] == 1


def collectives_and_shards() -> dict[str, Any]:
    barrier()
    value = broadcast_from_rank_zero({"seed": 7})
    try:
        cairn.get_dataset_shard("train")
    except Exception as exc:  # no datasets= given: the same error as in a worker
        shard_error = f"{type(exc).__name__}: {exc}"
    return {"broadcast": value, "shard_error": shard_error}


def test_collectives_work_and_a_missing_dataset_shard_is_named(
        run_config: RunConfigFactory) -> None:
    local = Trainer(collectives_and_shards, scaling_config=LOCAL, run_config=run_config()).fit()
    workers = Trainer(collectives_and_shards, scaling_config=ScalingConfig(num_workers=1),
                      run_config=run_config(name="workers")).fit()
    assert local.return_value == workers.return_value
    assert local.return_value["broadcast"] == {"seed": 7}
    assert "'train'" in local.return_value["shard_error"]


def score_checkpoint(checkpoint: Checkpoint) -> dict[str, Any]:
    with checkpoint.as_directory() as directory:
        return {"val_step": int(Path(directory, "step").read_text()) * 10}


def test_validation_runs_and_merges_its_metrics(run_config: RunConfigFactory) -> None:
    def train() -> list[dict[str, Any]]:
        for step in range(2):
            with tempfile.TemporaryDirectory() as directory:
                Path(directory, "step").write_text(str(step))
                cairn.report({"step": step}, checkpoint=Checkpoint.from_directory(directory),
                             validation=True)
        return [{"name": Path(r.checkpoint.path).name, "metrics": r.metrics}
                for r in cairn.get_all_reported_checkpoints()]

    result = Trainer(train, scaling_config=LOCAL, run_config=run_config(),
                     validation_config=cairn.ValidationConfig(score_checkpoint)).fit()
    assert result.return_value == [
        {"name": "checkpoint_000001", "metrics": {"step": 0, "val_step": 0}},
        {"name": "checkpoint_000002", "metrics": {"step": 1, "val_step": 10}},
    ]


def test_the_cli_shows_a_local_mode_run(run_config: RunConfigFactory,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    config = run_config()
    Trainer(counting, train_loop_config={"steps": 2}, scaling_config=LOCAL,
            run_config=config).fit()
    capsys.readouterr()
    assert cli_main(["show", str(Path(config.storage_path, "run")), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["status"] == "finished"
    assert [c["dir_name"] for c in shown["checkpoints"]] == ["checkpoint_000001",
                                                             "checkpoint_000002"]


BREAKPOINT_SCRIPT = textwrap.dedent("""
    import sys
    import cairn

    def train():
        secret = 41 + 1
        breakpoint()
        cairn.report({"secret": secret})

    result = cairn.Trainer(train, scaling_config=cairn.ScalingConfig(num_workers=0),
                           run_config=cairn.RunConfig(name="pdb", storage_path=sys.argv[1])).fit()
    print("metrics", result.metrics)
""")


def test_a_breakpoint_in_the_train_function_stops_in_the_driver(tmp_path: Path) -> None:
    script = tmp_path / "debug_me.py"
    script.write_text(BREAKPOINT_SCRIPT)
    env = {**os.environ, "PYTHONBREAKPOINT": "pdb.set_trace"}
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "runs")],
                          input="p secret * 2\nc\n", capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert "(Pdb) 84" in done.stdout
    assert "metrics {'secret': 42}" in done.stdout


def test_a_controller_that_ends_the_run_stops_a_train_function_waiting_on_it(
        run_config: RunConfigFactory) -> None:
    # The lease is removed by hand: the controller refuses to commit and ends the run while
    # the train function waits for its SYNC report's commit. A worker process would be
    # killed; in local mode the wait is interrupted, and fit() raises the controller's error.
    seen: list[BaseException] = []
    config = run_config()

    def train() -> None:
        Path(config.storage_path, "run", LEASE_NAME).unlink()
        try:
            save_step(0)
        except BaseException as exc:
            seen.append(exc)
            raise

    with pytest.raises(RunLeaseError, match=r"lease of the run at .* was removed"):
        Trainer(train, scaling_config=LOCAL, run_config=config).fit()
    assert [type(e) for e in seen] == [TrainFunctionStopped]
    assert cairn_threads() == []


def test_a_stop_interrupts_a_wait_of_the_main_thread() -> None:
    # What the controller's kill does to a local-mode train function blocked in a wait (a
    # SYNC report whose commit will not come): the stop signal's handler raises.
    assert STOP_SIGNAL is not None and threading.current_thread() is threading.main_thread()
    worker = InProcessWorker(Bootstrap(("127.0.0.1", 1), b"k", 0))
    previous = signal.signal(STOP_SIGNAL, lambda signum, frame: worker.raise_if_stopped())
    try:
        assert worker.begin(STOP_SIGNAL)
        threading.Timer(0.2, worker.stop).start()
        with pytest.raises(TrainFunctionStopped):
            threading.Event().wait()
        worker.end(1)
        # After the end, nothing is raised any more.
        signal.pthread_kill(threading.get_ident(), STOP_SIGNAL)
    finally:
        signal.signal(STOP_SIGNAL, previous)
    worker.close()


def test_a_stopped_attempt_raises_in_the_thread_running_it() -> None:
    worker = InProcessWorker(Bootstrap(("127.0.0.1", 1), b"k", 0))
    started, outcome = threading.Event(), []

    def train_function() -> None:
        assert worker.begin()
        started.set()
        try:
            while True:
                pass
        except TrainFunctionStopped as exc:
            outcome.append(exc)
        worker.end(1, outcome[0])

    thread = threading.Thread(target=train_function)
    thread.start()
    started.wait()
    worker.stop()
    thread.join()
    assert isinstance(outcome[0], TrainFunctionStopped)
    assert worker.wait_exit(0) and os.read(worker.fileno(), 1) == b"x"
    assert "ended with TrainFunctionStopped" in worker.describe_exit()
    # A stop before the thread took the attempt: it never starts.
    late = InProcessWorker(Bootstrap(("127.0.0.1", 1), b"k", 1))
    late.stop()
    assert not late.begin()
    worker.close()
    late.close()


TORCHRUN_ENV = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def test_torch_trainer_in_local_mode_has_no_process_group(run_config: RunConfigFactory) -> None:
    pytest.importorskip("torch")
    import torch.distributed as dist

    from cairn.torch import TorchTrainer, get_device, prepare_model

    def train() -> dict[str, Any]:
        import torch

        model = prepare_model(torch.nn.Linear(2, 1))
        return {"initialized": dist.is_initialized(), "device": str(get_device()),
                "wrapped": type(model).__name__,
                "env": {name: os.environ.get(name) for name in TORCHRUN_ENV}}

    result = TorchTrainer(train, scaling_config=LOCAL, run_config=run_config()).fit()
    assert result.return_value == {"initialized": False, "device": "cpu", "wrapped": "Linear",
                                   "env": dict.fromkeys(TORCHRUN_ENV)}


def test_torch_trainer_in_local_mode_with_use_gpu_and_no_gpu_says_so(
        run_config: RunConfigFactory) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    from cairn.torch import TorchTrainer

    with pytest.raises(TrainingFailedError,
                       match=r"ConfigError: ScalingConfig\(num_workers=0, use_gpu=True\), but "
                             r"this process sees no CUDA device"):
        TorchTrainer(counting, train_loop_config={"steps": 1},
                     scaling_config=ScalingConfig(num_workers=0, use_gpu=True),
                     run_config=run_config(failure_config=FailureConfig(max_failures=2))).fit()


def test_torch_trainer_in_local_mode_ends_a_process_group_a_failed_attempt_left(
        run_config: RunConfigFactory) -> None:
    pytest.importorskip("torch")
    import torch.distributed as dist

    from cairn.torch import TorchTrainer

    seen: list[bool] = []

    def train() -> None:
        # What Lightning's DDP strategy does in local mode: a process group of its own.
        seen.append(dist.is_initialized())
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0,
                                world_size=1)
        if len(seen) == 1:
            raise RuntimeError("first attempt fails")

    TorchTrainer(train, scaling_config=LOCAL,
                 run_config=run_config(failure_config=FailureConfig(max_failures=1))).fit()
    assert seen == [False, False]
    assert not dist.is_initialized()


def test_torch_trainer_in_local_mode_under_torchrun_is_refused(
        run_config: RunConfigFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    from cairn.torch import TorchTrainer

    for name, value in TORCHRUN_ENV.items():
        monkeypatch.setenv(name, value)
    config = run_config()
    with pytest.raises(ConfigError,
                       match=r"ScalingConfig\(num_workers=0\) under torchrun \(WORLD_SIZE=2, "
                             r"RANK=1\): Cairn's local mode runs one process, the driver, "
                             r"which owns the run; .* Launch the script once with plain "
                             r"python \(not torchrun\) and ScalingConfig\(num_workers=2\)"):
        TorchTrainer(counting, train_loop_config={"steps": 1}, scaling_config=LOCAL,
                     run_config=config).fit()
    assert not Path(config.storage_path, "run").exists()
    # torchrun with one process is a world of one: local mode runs.
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    result = TorchTrainer(counting, train_loop_config={"steps": 1}, scaling_config=LOCAL,
                          run_config=config).fit()
    assert result.return_value["world"] == (0, 1)
