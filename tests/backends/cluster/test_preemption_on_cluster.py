"""A drained Ray node is the preemption notice (a real 3-node ``cluster_utils`` cluster).

``ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION`` (the GCS ``DrainNode`` RPC the
autoscaler sends before a spot node is reclaimed) on the node of one rank: every rank
learns it through ``get_preemption_info()`` and makes a just-in-time SYNC report; then the
node is removed (the reclaim), the run restarts on the nodes left, resumes from exactly
that checkpoint, and the restart counts as a preemption, not a failure.
"""

from __future__ import annotations

import json
import os
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
from cairn import FailureConfig, ScalingConfig, Trainer
from cairn._src.checkpoint.index import read_index
from cairn._src.run.events import Failure, PreemptionNotice, read_events
from cairn._src.run.layout import EVENTS_DIR
from cairn._src.storage.location import resolve

from .conftest import RayCluster
from .test_node_loss import wait_for_files

pytestmark = pytest.mark.slow

RunConfigFactory = Callable[..., cairn.RunConfig]


def _read(scratch: str, name: str) -> Any:
    with open(os.path.join(scratch, name)) as f:
        return json.load(f)


def drain_node(address: str, node_id: str, deadline_s: int) -> None:
    """Ray's own command, as an operator or a script runs it."""
    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    subprocess.run([ray_cli, "drain-node", "--address", address, "--node-id", node_id,
                    "--reason", "DRAIN_NODE_REASON_PREEMPTION", "--reason-message",
                    "spot instance reclaimed", "--deadline-remaining-seconds",
                    str(deadline_s)], check=True, capture_output=True, timeout=120)


def test_node_drain_is_the_notice_and_the_jit_checkpoint_the_resume_point(
        cluster: RayCluster, run_config: RunConfigFactory, scratch: str) -> None:
    config = run_config(failure_config=FailureConfig(max_failures=0))
    outcome: dict[str, Any] = {}
    ended = threading.Event()

    def fit() -> None:
        try:
            outcome["result"] = Trainer(
                preemption_workloads.just_in_time,
                train_loop_config={"steps": 8, "scratch": scratch, "hold": [0], "ray": True,
                                   "await_notice": [0]},
                scaling_config=ScalingConfig(num_workers=2, backend="ray"),
                run_config=config).fit()
        except BaseException as exc:
            outcome["error"] = exc
        finally:
            ended.set()

    # The driver runs on a thread: Ray adds nodes only from the main thread.
    driver = threading.Thread(target=fit, name="driver", daemon=True)
    driver.start()
    assert wait_for_files([os.path.join(scratch, f"node_0_{r}") for r in (0, 1)], ended), (
        outcome.get("error"))
    nodes = {rank: _read(scratch, f"node_0_{rank}") for rank in (0, 1)}
    head = cluster.cluster.head_node.node_id
    drained_rank = next(r for r in (1, 0) if nodes[r] != head)
    drained = nodes[drained_rank]
    drain_node(cluster.address, drained, deadline_s=600)
    try:
        assert wait_for_files([os.path.join(scratch, f"jit_0_{r}") for r in (0, 1)],
                              ended), outcome.get("error")
    finally:
        # The reclaim; a drained node would take no more work from the next tests either.
        cluster.cluster.remove_node(cluster.worker_node(drained))
    driver.join(300)
    assert not driver.is_alive() and "error" not in outcome, outcome.get("error")

    jit = [_read(scratch, f"jit_0_{rank}") for rank in (0, 1)]
    assert jit[0] == jit[1]
    assert jit[0]["nodes"] == [drained] and jit[0]["ranks"] == [drained_rank]
    assert jit[0]["deadline_ms"] is not None
    resumed = resumed_steps(scratch)
    assert resumed[(1, 0)] == resumed[(1, 1)] == jit[0]["step"] + 1
    directory = run_dir(config)
    check_run(directory, scratch)
    index = read_index(resolve(directory), cairn.RetryPolicy())
    assert index is not None and (index.preemptions, index.failures) == (1, 0)
    events = read_events(resolve(directory).join(EVENTS_DIR), cairn.RetryPolicy())
    assert [(e.source, e.nodes) for e in events if isinstance(e, PreemptionNotice)] == [
        ("drain", (drained,))]
    assert [(f.preemption, f.counted) for f in events if isinstance(f, Failure)] == [
        (True, False)]
    result: cairn.Result = outcome["result"]
    assert result.metrics is not None and result.metrics["step"] == 8


def test_a_node_lost_after_a_drain_no_worker_saw_is_still_a_preemption(
        cluster: RayCluster, run_config: RunConfigFactory, scratch: str) -> None:
    # The workers poll for drains once an hour here, so none sees it: the node is drained
    # and removed, and Ray says the actor died with a preempted node (RayActorError.
    # preempted), which Ray Train counts as a preemption too.
    config = run_config(failure_config=FailureConfig(max_failures=0),
                        worker_env={"CAIRN_DRAIN_POLL_S": "3600"})
    outcome: dict[str, Any] = {}
    ended = threading.Event()

    def fit() -> None:
        try:
            outcome["result"] = Trainer(
                preemption_workloads.just_in_time,
                train_loop_config={"steps": 6, "scratch": scratch, "every": 1, "ray": True,
                                   "hold_without_notice": [0]},
                scaling_config=ScalingConfig(num_workers=2, backend="ray"),
                run_config=config).fit()
        except BaseException as exc:
            outcome["error"] = exc
        finally:
            ended.set()

    driver = threading.Thread(target=fit, name="driver", daemon=True)
    driver.start()
    assert wait_for_files([os.path.join(scratch, f"holding_0_{r}") for r in (0, 1)], ended), (
        outcome.get("error"))
    nodes = {rank: _read(scratch, f"node_0_{rank}") for rank in (0, 1)}
    head = cluster.cluster.head_node.node_id
    lost = next(r for r in (1, 0) if nodes[r] != head)
    drain_node(cluster.address, nodes[lost], deadline_s=1)
    # Ray records a node's death as a preemption when it goes after its drain deadline.
    time.sleep(2.0)
    cluster.cluster.remove_node(cluster.worker_node(nodes[lost]))
    driver.join(300)
    assert not driver.is_alive() and "error" not in outcome, outcome.get("error")
    assert not os.path.exists(os.path.join(scratch, "jit_0_0"))  # no notice reached a rank
    assert resumed_steps(scratch)[(1, 0)] == 2
    directory = run_dir(config)
    index = read_index(resolve(directory), cairn.RetryPolicy())
    assert index is not None and (index.preemptions, index.failures) == (1, 0)
    events = read_events(resolve(directory).join(EVENTS_DIR), cairn.RetryPolicy())
    assert [(e.source, e.ranks) for e in events if isinstance(e, PreemptionNotice)] == [
        ("node preempted", (lost,))]
    failure = next(e for e in events if isinstance(e, Failure))
    assert failure.preemption and "which was preempted" in (failure.reason or "")
