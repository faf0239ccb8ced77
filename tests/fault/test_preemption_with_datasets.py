"""A SIGTERM to a local worker that streams a Ray Data shard is still a preemption notice.

A local worker connects to Ray as a driver of its own for its shard (``ray.init``), and
Ray's init sets a SIGTERM handler that exits the process: the worker keeps the handler it
had, so the notice reaches every rank and the restart counts against
``max_preemption_failures``, not ``max_failures``; a SIGTERM during the init itself too.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator

import dataset_preemption_workloads
import pytest
from invariants import resumed_steps, run_dir
from ray_clusters import own_ray_cluster
from test_preemption import _events, _read, _reclaim_after_jit

import cairn
from cairn import FailureConfig, ScalingConfig, Trainer
from cairn._src.checkpoint.index import read_index
from cairn._src.run.events import Failure, PreemptionNotice
from cairn._src.storage.location import resolve
from cairn._src.storage.retry import RetryPolicy

RunConfigFactory = Callable[..., cairn.RunConfig]

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    # A cluster of its own ("local"), on 127.0.0.1 (tests/conftest.py); the local workers
    # hold no Ray CPUs, so two are enough for Ray Data's tasks.
    yield from own_ray_cluster(num_cpus=2)


@pytest.mark.slow
def test_sigterm_to_a_worker_streaming_a_shard_is_a_preemption_notice(
        ray_cluster: None, run_config: RunConfigFactory, scratch: str) -> None:
    stop = threading.Event()
    # Each rank writes its pid once it has read its shard, so Ray's init is behind it.
    reclaimer = threading.Thread(target=_reclaim_after_jit, args=(scratch, stop), daemon=True)
    reclaimer.start()
    config = run_config(failure_config=FailureConfig(max_failures=0,
                                                     max_preemption_failures=1))
    try:
        result = Trainer(dataset_preemption_workloads.read_shard_then_just_in_time,
                         train_loop_config={"scratch": scratch, "steps": 30, "hold": [0],
                                            "await_notice": [0]},
                         datasets={"train": ray.data.range(40)},
                         scaling_config=ScalingConfig(num_workers=2),
                         run_config=config).fit()
    finally:
        stop.set()
        reclaimer.join()
    assert result.error is None
    for attempt in (0, 1):
        ids = [set(_read(scratch, f"ids_{attempt}_{rank}")) for rank in (0, 1)]
        assert ids[0] | ids[1] == set(range(40)) and not ids[0] & ids[1]
    jit = [_read(scratch, f"jit_0_{rank}") for rank in (0, 1)]
    assert jit[0] == jit[1] and jit[0]["ranks"] == [0, 1]
    assert resumed_steps(scratch)[(1, 0)] == jit[0]["step"] + 1
    index = read_index(resolve(run_dir(config)), RetryPolicy())
    assert index is not None and (index.preemptions, index.failures) == (1, 0)
    events = _events(run_dir(config))
    assert [(n.attempt, n.source) for n in events if isinstance(n, PreemptionNotice)] == [
        (0, "SIGTERM")]
    assert [(f.attempt, f.preemption, f.counted) for f in events
            if isinstance(f, Failure)] == [(0, True, False)]
    assert result.metrics is not None and result.metrics["step"] == 30


# A process that installs its own SIGTERM handler, then connects to Ray as a local worker
# does for its shard, with a SIGTERM landing inside ray.init (once Ray's own part of the
# init has run): the process's handler takes it, the process goes on.
_SIGTERM_DURING_INIT = """
import os, signal, sys
import ray
from cairn._src.wire import datasets

noticed = []
def on_sigterm(signum, frame):
    noticed.append(signum)
signal.signal(signal.SIGTERM, on_sigterm)
real_init = ray.init
def init_then_sigterm(*args, **kwargs):
    connected = real_init(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGTERM)
    return connected
ray.init = init_then_sigterm
datasets._init_keeping_signal_handlers(sys.argv[1])
assert ray.is_initialized()
print("noticed", noticed, "handler kept", signal.getsignal(signal.SIGTERM) is on_sigterm)
"""


def test_sigterm_during_ray_init_meets_the_workers_handler(ray_cluster: None) -> None:
    address = ray.get_runtime_context().gcs_address
    done = subprocess.run([sys.executable, "-c", _SIGTERM_DURING_INIT, address],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"noticed [{int(signal.SIGTERM)}] handler kept True" in done.stdout
    # Ray's warning that it set no handler (the init ran off the main thread) is dropped.
    assert "SIGTERM handler is not set" not in done.stderr + done.stdout
