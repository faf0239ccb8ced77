"""Preemption on the local backend, with real processes and real signals.

A SIGTERM to a worker process is the notice that the machine is about to be reclaimed:
every rank learns it through ``get_preemption_info()``, makes a just-in-time SYNC report,
and the restart that follows (the workers killed, or the deadline passed) resumes from that
checkpoint and counts against ``max_preemption_failures``, not ``max_failures``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import preemption_workloads
import pytest
from invariants import check_run, resumed_steps, run_dir

import cairn
from cairn import FailureConfig, PreemptionError, ScalingConfig, Trainer
from cairn._src.checkpoint.index import read_index
from cairn._src.run.events import AttemptStart, Failure, PreemptionNotice, read_events
from cairn._src.run.layout import EVENTS_DIR
from cairn._src.storage.location import resolve
from cairn._src.storage.retry import RetryPolicy

RunConfigFactory = Callable[..., cairn.RunConfig]


def _read(scratch: str, name: str) -> Any:
    with open(os.path.join(scratch, name)) as f:
        return json.load(f)


def _wait_for(scratch: str, names: list[str], stop: threading.Event) -> bool:
    while not stop.is_set():
        if all(os.path.exists(os.path.join(scratch, n)) for n in names):
            return True
        time.sleep(0.01)
    return False


def _reclaim_after_jit(scratch: str, stop: threading.Event) -> None:
    """SIGTERM rank 1 of attempt 0 once both ranks run; SIGKILL both once their
    just-in-time report returned (the machine is gone)."""
    if not _wait_for(scratch, ["pid_0_0", "pid_0_1"], stop):
        return
    pids = [_read(scratch, f"pid_0_{rank}") for rank in (0, 1)]
    os.kill(pids[1], signal.SIGTERM)
    if _wait_for(scratch, ["jit_0_0", "jit_0_1"], stop):
        for pid in pids:
            os.kill(pid, signal.SIGKILL)


def _events(directory: str) -> list[Any]:
    return read_events(resolve(directory).join(EVENTS_DIR), RetryPolicy())


def _fit(run_config: RunConfigFactory, scratch: str, failure: FailureConfig,
         **job: Any) -> tuple[cairn.Result, str]:
    config = run_config(failure_config=failure)
    directory = run_dir(config)
    job = {"steps": 400, "scratch": scratch, **job}
    result = Trainer(preemption_workloads.just_in_time, train_loop_config=job,
                     scaling_config=ScalingConfig(num_workers=2), run_config=config).fit()
    return result, directory


def test_sigterm_notice_jit_checkpoint_is_the_resume_point(
        run_config: RunConfigFactory, scratch: str) -> None:
    stop = threading.Event()
    reclaimer = threading.Thread(target=_reclaim_after_jit, args=(scratch, stop), daemon=True)
    reclaimer.start()
    try:
        # max_failures=0: the preemption restart does not draw on it.
        result, directory = _fit(run_config, scratch,
                                 FailureConfig(max_failures=0, max_preemption_failures=1),
                                 hold=[0], await_notice=[0], steps=30)
    finally:
        stop.set()
        reclaimer.join()
    jit = [_read(scratch, f"jit_0_{rank}") for rank in (0, 1)]
    # Both ranks saw the same notice at the same call: the whole machine, both ranks.
    assert jit[0] == jit[1]
    assert jit[0]["ranks"] == [0, 1] and jit[0]["nodes"] == ["local"]
    assert jit[0]["deadline_ms"] is None  # a SIGTERM carries no deadline
    resumed = resumed_steps(scratch)
    assert resumed[(1, 0)] == resumed[(1, 1)] == jit[0]["step"] + 1

    check_run(directory, scratch)
    index = read_index(resolve(directory), RetryPolicy())
    assert index is not None and (index.preemptions, index.failures) == (1, 0)
    events = _events(directory)
    notices = [e for e in events if isinstance(e, PreemptionNotice)]
    assert [(n.attempt, n.ranks, n.source) for n in notices] == [(0, (0, 1), "SIGTERM")]
    failures = [e for e in events if isinstance(e, Failure)]
    assert [(f.attempt, f.preemption, f.counted) for f in failures] == [(0, True, False)]
    # Attempt 1 resumed from the just-in-time checkpoint, the last one attempt 0 committed.
    starts = [e for e in events if isinstance(e, AttemptStart)]
    jit_dir = [c.path.rsplit("/", 1)[-1] for c, m in result.best_checkpoints
               if m.get("jit") == 1]
    assert len(jit_dir) == 1 and starts[1].resume == jit_dir[0]
    assert result.metrics is not None and result.metrics["step"] == 30

    shown = subprocess.run([sys.executable, "-m", "cairn", "show", directory],
                           capture_output=True, text=True, check=True).stdout
    assert "preemption" in shown and "max_preemption_failures" in shown


def test_deadline_tears_down_workers_that_keep_running(
        run_config: RunConfigFactory, scratch: str) -> None:
    # Rank 0 sends itself SIGTERM at step 1; nobody kills the workers: at the deadline
    # (1 s after the notice, plus no grace) Cairn stops them and restarts.
    result, directory = _fit(
        run_config, scratch,
        FailureConfig(max_failures=0, preemption_deadline_s=1.0),
        self_notice=[0], hold=[0], await_notice=[0], steps=12)
    resumed = resumed_steps(scratch)
    jit_step = _read(scratch, "jit_0_0")["step"]
    assert resumed[(1, 0)] == jit_step + 1
    failures = [e for e in _events(directory) if isinstance(e, Failure)]
    assert len(failures) == 1 and failures[0].preemption
    assert failures[0].reason is not None and "reclaim deadline" in failures[0].reason
    assert result.metrics is not None and result.metrics["step"] == 12


def test_spent_preemption_budget_fails_the_run_with_preemption_error(
        run_config: RunConfigFactory, scratch: str) -> None:
    with pytest.raises(PreemptionError,
                       match=r"interrupted by node preemption \(preempted_ranks=\[0, 1\], "
                             r"drain_timed_out=True\)") as raised:
        _fit(run_config, scratch,
             FailureConfig(max_failures=5, max_preemption_failures=1, preemption_deadline_s=1.0),
             self_notice=[0, 1], hold=[0, 1], await_notice=[0, 1], steps=12)
    assert raised.value.drain_timed_out
    assert raised.value.preemption_info.preempted_ranks == [0, 1]
    directory = os.path.join(os.path.dirname(scratch), "storage", "run")
    index = read_index(resolve(directory), RetryPolicy())
    assert index is not None and (index.preemptions, index.failures) == (2, 0)
    # Both attempts resumed right after their just-in-time checkpoint.
    assert resumed_steps(scratch)[(1, 0)] == _read(scratch, "jit_0_0")["step"] + 1
    error = cairn.Result.from_path(directory).error
    assert error is not None and "PreemptionError" in type(error).__name__ + str(
        getattr(error, "error_type", ""))


def test_a_finished_train_function_finishes_the_run_despite_a_notice(
        run_config: RunConfigFactory, scratch: str) -> None:
    # Ray's rule: a run whose train function returns finishes, notice or not.
    result, directory = _fit(run_config, scratch, FailureConfig(preemption_deadline_s=60.0),
                             self_notice=[0], await_notice=[0], steps=4)
    assert result.metrics is not None and result.metrics["step"] == 4
    assert not [e for e in _events(directory) if isinstance(e, Failure)]
    assert [e.source for e in _events(directory) if isinstance(e, PreemptionNotice)] == [
        "SIGTERM"]


def test_a_forked_child_of_a_worker_still_dies_of_sigterm(
        run_config: RunConfigFactory, scratch: str) -> None:
    config = run_config()
    Trainer(preemption_workloads.sigterm_a_forked_child, train_loop_config={"scratch": scratch},
            scaling_config=ScalingConfig(num_workers=2), run_config=config).fit()
    assert [_read(scratch, f"child_exit_{rank}") for rank in (0, 1)] == [-signal.SIGTERM] * 2
    assert not [e for e in _events(run_dir(config)) if isinstance(e, PreemptionNotice)]


def _workers_of_this_process() -> list[int]:
    """The local backend's worker processes this test's driver started."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read()
        except (OSError, ValueError, IndexError):
            continue
        if parent == os.getpid() and b"cairn._src.worker.main" in command:
            found.append(int(entry))
    return found


def test_a_notice_that_comes_while_a_worker_starts_is_a_notice(
        run_config: RunConfigFactory, scratch: str) -> None:
    # SIGTERM the moment the worker process exists, while it still imports: it waits for
    # the notice's handler instead of killing the worker (a failure, not a preemption).
    stop = threading.Event()
    signalled: list[int] = []

    def notice_at_start() -> None:
        while not stop.is_set() and not signalled:
            for pid in _workers_of_this_process()[:1]:
                os.kill(pid, signal.SIGTERM)
                signalled.append(pid)
            time.sleep(0.001)

    thread = threading.Thread(target=notice_at_start, daemon=True)
    thread.start()
    try:
        result, directory = _fit(run_config, scratch,
                                 FailureConfig(max_failures=0, preemption_deadline_s=60.0),
                                 await_notice=[0], steps=4)
    finally:
        stop.set()
        thread.join()
    assert signalled
    assert result.metrics is not None and result.metrics["step"] == 4
    assert not [e for e in _events(directory) if isinstance(e, Failure)]
    assert [e.source for e in _events(directory) if isinstance(e, PreemptionNotice)] == [
        "SIGTERM"]
