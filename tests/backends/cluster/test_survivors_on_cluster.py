"""FailureConfig(keep_survivors=True) on a real 3-node Ray cluster: the node of one rank is
removed (``cluster.remove_node``) while the other waits in a gloo all_reduce with it.

The surviving rank keeps its actor (its pid), the lost rank's actor is placed again in
its bundle of the placement group, on the node left free, and restores from the
survivor's memory copy; the resumed training is bit-exact against a run without failures.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

import pytest
import survivor_workloads
import torch
from invariants import check_run, run_dir

import cairn
from cairn import CheckpointConfig, FailureConfig, ScalingConfig
from cairn._src.run.events import AttemptStart, Restored, RestorePlanned, read_events
from cairn._src.run.layout import EVENTS_DIR
from cairn._src.storage.location import resolve
from cairn.torch import TorchTrainer

from .conftest import RayCluster
from .test_node_loss import wait_for_files

pytestmark = pytest.mark.slow

RunConfigFactory = Callable[..., cairn.RunConfig]
JOB = {"epochs": 3, "every": 5}


def _read(scratch: str, name: str) -> Any:
    with open(os.path.join(scratch, name)) as f:
        return json.load(f)


def _trainer(config: cairn.RunConfig, scratch: str, faults: dict[str, Any]) -> TorchTrainer:
    return TorchTrainer(
        survivor_workloads.train,
        train_loop_config={**JOB, "scratch": scratch, "faults": faults},
        scaling_config=ScalingConfig(num_workers=2, backend="ray"),
        run_config=config)


@pytest.mark.parametrize("warm_standby", [False, True])
def test_node_loss_keeps_the_survivor_and_restores_the_lost_rank_from_its_peer(
    cluster: RayCluster, run_config: RunConfigFactory, tmp_path: Any,
    caplog: pytest.LogCaptureFixture, warm_standby: bool,
) -> None:
    reference_dir = tmp_path / "reference"
    reference_dir.mkdir()
    reference = _trainer(run_config(name="reference"), str(reference_dir), {}).fit()
    assert reference.error is None

    scratch = str(tmp_path / "lost")
    os.mkdir(scratch)
    head = cluster.cluster.head_node.node_id
    # With warm standby, the spare on the lost node is gone with it: the lost rank's new
    # actor is a fresh one, or a spare of the node its bundle is placed on again.
    config = run_config(name="lost", failure_config=FailureConfig(
                            max_failures=1, keep_survivors=True, warm_standby=warm_standby),
                        checkpoint_config=CheckpointConfig(num_to_keep=2))
    outcome: dict[str, Any] = {}
    ended = threading.Event()

    def fit() -> None:
        try:
            outcome["result"] = _trainer(config, scratch, {
                "0": {"kind": "lose_node", "step": 13, "head": head}}).fit()
        except BaseException as exc:
            outcome["error"] = exc
        finally:
            ended.set()

    caplog.set_level(logging.INFO, logger="cairn")
    # The driver runs on a thread: Ray adds nodes only from the main thread.
    driver = threading.Thread(target=fit, name="driver", daemon=True)
    driver.start()
    assert wait_for_files([os.path.join(scratch, "holding.json")], ended), outcome.get("error")
    lost = _read(scratch, "holding.json")
    lost_node = _read(scratch, f"node_{lost}.json")
    kept = 1 - lost
    cluster.cluster.remove_node(cluster.worker_node(lost_node))
    driver.join(300)
    assert not driver.is_alive() and "error" not in outcome, outcome.get("error")
    result: cairn.Result = outcome["result"]
    assert result.error is None
    check_run(run_dir(config), scratch)
    assert result.goodput.attempts == 2 and result.goodput.failures == 1
    assert f"kept ranks [{kept}], replacing [{lost}]" in caplog.text

    # The survivor ran attempt 1 in its own actor; the lost rank's ran on another node.
    assert _read(scratch, f"pid_1_{kept}.json") == _read(scratch, f"pid_0_{kept}.json")
    assert _read(scratch, f"pid_1_{lost}.json") != _read(scratch, f"pid_0_{lost}.json")
    assert _read(scratch, f"resumed_1_{kept}.json") == _read(scratch, f"resumed_1_{lost}.json")
    assert _read(scratch, f"resumed_1_{lost}.json") == 10

    # Bit-exact against the run without failures.
    final, expected = result.return_value, reference.return_value
    assert final["step"] == expected["step"]
    for name, tensor in expected["model"].items():
        assert torch.equal(final["model"][name], tensor), name
    assert torch.equal(final["next_draw"], expected["next_draw"])

    events = list(read_events(resolve(result.path).join(EVENTS_DIR), cairn.RetryPolicy()))
    starts = [e for e in events if isinstance(e, AttemptStart)]
    assert starts[-1].kept == (kept,) and starts[-1].replaced == (lost,)
    planned = {e.rank: e for e in events if isinstance(e, RestorePlanned)}
    assert planned[kept].kind == "memory" and planned[lost].kind == "peer", planned
    assert planned[lost].peer == kept, planned
    restored = {e.rank: e for e in events if isinstance(e, Restored)}
    # Its own files come from the peer or, small as they are here, from the driver's
    # copies: which, depends on which rank the lost node held (rank 0 saves the model).
    # The event names the peer only where the restore used bytes from it.
    sources = set(restored[lost].kind.split("+"))
    assert sources <= {"peer", "driver"}, restored
    assert restored[lost].peer == (kept if "peer" in sources else None), restored
    assert (restored[lost].peer_bytes > 0) == ("peer" in sources), restored
    # From storage: only the small per-rank state of the other rank (its RNGs).
    assert restored[lost].bytes < 64 * 1024, restored
