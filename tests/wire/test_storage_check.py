"""Every worker must see the run's storage: a marker the driver writes, workers read back.

A path that exists only for the driver is played by ``nodelocal://``, a scheme whose root
directory comes from an environment variable that the workers get set differently.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from channel_support import node_local_store

import cairn
from cairn import FailureConfig, RunConfig, ScalingConfig, Trainer
from cairn._src.run.storage_check import MARKER_NAME
from cairn.storage import register_scheme, unregister_scheme


def train_and_leave_a_file(config: dict[str, str]) -> None:
    rank = cairn.get_context().get_world_rank()
    open(os.path.join(config["scratch"], f"started_{rank}"), "w").close()
    cairn.report({"rank": rank})


@pytest.fixture
def roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Path]]:
    driver, worker = tmp_path / "driver_node", tmp_path / "worker_node"
    driver.mkdir()
    worker.mkdir()
    monkeypatch.setenv("CAIRN_TEST_NODE_ROOT", str(driver))
    register_scheme("nodelocal", node_local_store, overwrite=True)
    yield driver, worker
    unregister_scheme("nodelocal")


def _config(worker_root: Path | None) -> RunConfig:
    env = {"CAIRN_TEST_NODE_ROOT": str(worker_root)} if worker_root is not None else None
    # Failures allowed: the storage check must fail the run anyway, without a restart.
    return RunConfig(name="run", storage_path="nodelocal://storage", worker_env=env,
                     failure_config=FailureConfig(max_failures=3))


def test_storage_a_worker_cannot_see_fails_the_run_at_once(
    roots: tuple[Path, Path], scratch: str
) -> None:
    driver, worker = roots
    host = socket.gethostname()
    # One worker: with two, the second rank's error may come after the failure grace,
    # and the summary would then name one rank or the other.
    with pytest.raises(cairn.TrainingFailedError) as caught:
        Trainer(train_and_leave_a_file, train_loop_config={"scratch": scratch},
                run_config=_config(worker)).fit()
    message = str(caught.value)
    assert (f"[rank 0] ConfigError: A worker on node {host} cannot see the run's "
            f"storage: the driver wrote nodelocal://storage/run/{MARKER_NAME} before "
            "training, and here it does not exist.") in message
    for advice in ("a local path works only when every node shares it at the same path (an "
                   "NFS mount, for example)", "s3://bucket/prefix",
                   "a custom scheme registered on every node"):
        assert advice in message
    assert os.listdir(scratch) == []  # no train function started
    index = json.loads((driver / "storage" / "run" / "cairn_run.json").read_text())
    assert index["attempts"] == 1
    # The marker is gone with the session; nothing was written on the worker's side.
    assert not (driver / "storage" / "run" / MARKER_NAME).exists()
    assert not (worker / "storage" / "run").exists()


def test_a_marker_of_another_session_is_not_taken_for_this_one(
    roots: tuple[Path, Path], scratch: str
) -> None:
    _driver, worker = roots
    stale = worker / "storage" / "run"
    stale.mkdir(parents=True)
    (stale / MARKER_NAME).write_text(json.dumps({"version": 1, "token": "0" * 32}))
    with pytest.raises(cairn.TrainingFailedError,
                       match=r"and here it holds another token: the path names a different "
                       r"directory on this node"):
        Trainer(train_and_leave_a_file, train_loop_config={"scratch": scratch},
                run_config=_config(worker)).fit()


def test_storage_every_worker_shares_keeps_working(
    roots: tuple[Path, Path], scratch: str
) -> None:
    driver, _worker = roots
    result = Trainer(train_and_leave_a_file, train_loop_config={"scratch": scratch},
                     scaling_config=ScalingConfig(num_workers=2),
                     run_config=_config(None)).fit()
    assert result.error is None
    assert sorted(os.listdir(scratch)) == ["started_0", "started_1"]
    assert not (driver / "storage" / "run" / MARKER_NAME).exists()
