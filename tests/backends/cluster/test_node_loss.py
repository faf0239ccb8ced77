"""A node of the Ray cluster removed mid-run (``cluster.remove_node``).

Every rank holds after a committed SYNC checkpoint; the test removes the node of one
rank. The lost worker is noticed through its actor's death and its closed connection
(no polling), the group is torn down and started again, on the nodes that are left
when they fit it, or else once capacity returns (the placement wait is logged and
bounded), and every rank resumes from the latest committed checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from invariants import check_run, run_dir

import cairn
from cairn import FailureConfig, ScalingConfig, Trainer
from cairn._src.backends.ray import PLACEMENT_TIMEOUT_ENV, PlacementTimeoutError
from cairn._src.run.layout import EVENTS_DIR
from cairn._src.run.segment_log import read_log
from cairn._src.storage.location import resolve

from . import cluster_workloads
from .conftest import RayCluster

pytestmark = pytest.mark.slow

RunConfigFactory = Callable[..., cairn.RunConfig]
HOLD_AT = 1


class _PlacementWaitSeen(logging.Handler):
    """Set when the backend logs that it waits for the cluster to place the workers."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("Waiting for the Ray cluster to place"):
            self.seen.set()


def wait_for_files(paths: list[str], stop: threading.Event, timeout: float = 240.0) -> bool:
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(p) for p in paths):
        if stop.is_set() or time.monotonic() > deadline:
            return False
        stop.wait(0.01)
    return True


@pytest.mark.parametrize(("workers", "warm_standby"), [(2, False), (3, False), (2, True)])
def test_node_removed_mid_run_restarts_and_resumes(
    workers: int, warm_standby: bool, cluster: RayCluster, run_config: RunConfigFactory,
    scratch: str, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="cairn._src.backends.ray")
    config = run_config(failure_config=FailureConfig(max_failures=1,
                                                     warm_standby=warm_standby))
    waits = _PlacementWaitSeen()
    logging.getLogger("cairn._src.backends.ray").addHandler(waits)
    outcome: dict[str, Any] = {}
    ended = threading.Event()

    def fit() -> None:
        try:
            outcome["result"] = Trainer(
                cluster_workloads.hold_after,
                train_loop_config={"steps": 4, "hold_at": HOLD_AT, "scratch": scratch},
                scaling_config=ScalingConfig(num_workers=workers, backend="ray"),
                run_config=config,
            ).fit()
        except BaseException as exc:
            outcome["error"] = exc
        finally:
            ended.set()

    # The driver runs on a thread: Ray adds nodes only from the main thread.
    driver = threading.Thread(target=fit, name="driver", daemon=True)
    driver.start()
    try:
        holding = [os.path.join(scratch, f"holding_{rank}") for rank in range(workers)]
        assert wait_for_files(holding, ended), outcome.get("error")
        # The last rank's node: with one CPU per node, no other rank shares it.
        nodes = {rank: json.load(open(os.path.join(scratch, f"node_0_{rank}")))
                 for rank in range(workers)}
        head = cluster.cluster.head_node.node_id
        lost = next(r for r in reversed(range(workers)) if nodes[r] != head)
        waits.seen.clear()  # only the restart's wait counts
        cluster.cluster.remove_node(cluster.worker_node(nodes[lost]))
        if workers == 3:
            # Two nodes are left for three workers: capacity returns once the restart
            # waits for it.
            assert waits.seen.wait(240), outcome.get("error")
            cluster.add_node()
        driver.join(300)
    finally:
        logging.getLogger("cairn._src.backends.ray").removeHandler(waits)
    assert not driver.is_alive() and "error" not in outcome, outcome.get("error")
    result: cairn.Result = outcome["result"]
    check_run(run_dir(config), scratch)
    assert result.goodput.attempts == 2 and result.goodput.failures == 1
    # The failure is the lost rank's, not that of the ranks torn down after it.
    failures = [e for e in read_events(run_dir(config)) if e.get("type") == "failure"]
    assert failures[0]["ranks"] == [lost]
    # Named with its node once Ray has marked it dead; the connection may close first.
    assert re.match(rf"\[rank {lost}\] Worker rank {lost} \(pid \d+\) (was lost with its "
                    rf"Ray node {nodes[lost][:12]} |closed its connection)",
                    failures[0]["reason"]), failures[0]["reason"]
    # Every rank resumed from the checkpoint of the step it held at, none behind it, and
    # none on the lost node.
    for rank in range(workers):
        assert json.load(open(os.path.join(scratch, f"resumed_1_{rank}"))) == HOLD_AT + 1
        assert json.load(open(os.path.join(scratch, f"node_1_{rank}"))) != nodes[lost]
    assert result.metrics == {"step": 3}
    # With warm standby, the restart ran both ranks in the spares on the nodes left.
    assert ("Running 2 of 2 ranks in warm standby Ray actors" in caplog.text) == warm_standby


def read_events(directory: str) -> list[dict[str, Any]]:
    return list(read_log(resolve(directory).join(EVENTS_DIR), cairn.RetryPolicy()))


def test_capacity_that_does_not_return_fails_clearly_and_a_rerun_resumes(
    cluster: RayCluster, run_config: RunConfigFactory, scratch: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = run_config(failure_config=FailureConfig(max_failures=1))
    job = {"steps": 4, "hold_at": HOLD_AT, "scratch": scratch}
    outcome: dict[str, Any] = {}
    ended = threading.Event()

    def fit() -> None:
        try:
            Trainer(cluster_workloads.hold_after, train_loop_config=job,
                    scaling_config=ScalingConfig(num_workers=3, backend="ray"),
                    run_config=config).fit()
        except BaseException as exc:
            outcome["error"] = exc
        finally:
            ended.set()

    driver = threading.Thread(target=fit, name="driver", daemon=True)
    driver.start()
    holding = [os.path.join(scratch, f"holding_{rank}") for rank in range(3)]
    assert wait_for_files(holding, ended), outcome.get("error")
    nodes = [json.load(open(os.path.join(scratch, f"node_0_{rank}"))) for rank in range(3)]
    lost = next(n for n in nodes if n != cluster.cluster.head_node.node_id)
    # The restart reads the timeout afresh: it waits 3 s for a node that never comes back.
    monkeypatch.setenv(PLACEMENT_TIMEOUT_ENV, "3")
    cluster.cluster.remove_node(cluster.worker_node(lost))
    driver.join(300)
    assert not driver.is_alive()
    error = outcome.get("error")
    assert isinstance(error, PlacementTimeoutError), error
    with pytest.raises(PlacementTimeoutError,
                       match=r"could not place 3 workers \(CPU 1 each, strategy PACK\) within "
                             r"3s: the workers need CPU 3 in all, the cluster has CPU 2\. The "
                             r"cluster has 2 alive nodes with CPU 2\. Add nodes"):
        raise error
    # Once capacity is back, running the same fit() again continues the run from the
    # checkpoint of the step the first run held at.
    cluster.add_node()
    monkeypatch.delenv(PLACEMENT_TIMEOUT_ENV)
    result = Trainer(cluster_workloads.hold_after, train_loop_config=job,
                     scaling_config=ScalingConfig(num_workers=3, backend="ray"),
                     run_config=config).fit()
    check_run(run_dir(config), scratch)
    attempt = result.goodput.attempts - 1
    assert attempt >= 1
    for rank in range(3):
        resumed = json.load(open(os.path.join(scratch, f"resumed_{attempt}_{rank}")))
        assert resumed == HOLD_AT + 1
    assert result.metrics == {"step": 3}
