"""Blame the cause (issue 9, item 6): a rank that dies is named before the ranks whose
collective then lost it; each error appears once in the text. A real 2-worker
``cairn.torch.TorchTrainer`` on gloo; rank 1 leaves with ``os._exit`` in an all_reduce loop.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import blame_workloads
import pytest

import cairn
from cairn import FailureConfig, ScalingConfig, TrainingFailedError
from cairn._src.controller.worker_failures import WorkerFailure, group_failures, ordered_ranks
from cairn.torch import TorchConfig, TorchTrainer


def test_the_rank_that_exited_is_named_first(
    run_config: Callable[..., cairn.RunConfig], scratch: str
) -> None:
    config = run_config(failure_config=FailureConfig(max_failures=0))
    with pytest.raises(TrainingFailedError) as caught:
        TorchTrainer(
            blame_workloads.exit_inside_allreduce,
            train_loop_config={"steps": 6, "exit_step": 2},
            torch_config=TorchConfig(timeout_s=3600),
            scaling_config=ScalingConfig(num_workers=2),
            run_config=config,
        ).fit()
    text = str(caught.value)
    headline = text.splitlines()[1]
    assert headline.startswith("[rank 1] Worker rank 1 (pid "), text
    assert "exited with code 3" in headline
    # Every line of the text appears once: no error repeated by a wrapping layer or by the
    # last line of its own traceback.
    assert text.count("exited with code 3") == 1, text
    assert text.count("Connection closed by peer") == 1, text
    events_dir = os.path.join(str(config.storage_path), "run", "events")
    events = [json.loads(line) for name in sorted(os.listdir(events_dir))
              for line in open(os.path.join(events_dir, name)) if line.strip()]
    failure = next(e for e in events if e["type"] == "failure")
    assert failure["ranks"][0] == 1
    assert failure["reason"].startswith("[rank 1] Worker rank 1")


def test_a_lost_peer_error_is_ordered_after_deaths_and_own_errors() -> None:
    lost = WorkerFailure(rank=0, summary="RuntimeError: [gloo/transport/tcp/pair.cc:534] "
                         "Connection closed by peer [127.0.0.1]:4242",
                         traceback="Traceback (most recent call last):\n  ...\nRuntimeError: "
                         "[gloo/transport/tcp/pair.cc:534] Connection closed by peer "
                         "[127.0.0.1]:4242", exception=b"x")
    own = WorkerFailure(rank=1, summary="ValueError: bad batch", traceback="Traceback\n"
                        "ValueError: bad batch", exception=b"x")
    died = WorkerFailure(rank=2, summary="Worker rank 2 (pid 9) was killed by SIGKILL",
                         traceback="")
    # Causes by rank (a death and an own error alike), then the lost peer.
    assert ordered_ranks([lost, own, died]) == [1, 2, 0]
    assert ordered_ranks([lost, died]) == [2, 0]
    text = group_failures([lost, died])
    assert text.splitlines()[0] == ("[rank 2] Worker rank 2 (pid 9) was killed by SIGKILL "
                                    "(and 1 more)")
    assert text.count("was killed by SIGKILL") == 1
    text = group_failures([lost, own, died])
    assert text.count("Connection closed by peer") == 1
    assert text.count("ValueError: bad batch") == 1
