"""The lease fences (issue 10, item 15): real drivers, real worker processes.

* a driver whose lease another driver took over stops committing at once and fails with
  RunLeaseError;
* two drivers started together on one run never both run it, on local storage (an
  exclusive create) and on a slow store without one (the fence);
* stale and invalid leases are taken over with a warning; ``cairn lease break`` clears one.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

import fault_store
import fault_workloads
import pytest
from driver_process import start_script
from invariants import check_run

import cairn
from cairn import RunLeaseError, ScalingConfig, Trainer
from cairn._src.checkpoint.manifest import MANIFEST_NAME
from cairn._src.cli.main import main as cli_main
from cairn._src.run.layout import LEASE_NAME

SCRIPT = os.path.join(os.path.dirname(__file__), "driver_script.py")


def trainer(storage: str, scratch: str, steps: int, step_s: float = 0.0) -> Trainer:
    return Trainer(
        fault_workloads.resumable,
        train_loop_config={"steps": steps, "step_s": step_s, "scratch": scratch,
                           "run_dir": os.path.join(storage, "run"), "first_index": 1},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=cairn.RunConfig(name="run", storage_path=storage))


def write_lease(storage: str, **fields: Any) -> None:
    lease: dict[str, Any] = {"version": 1, "host": socket.gethostname(), "pid": os.getppid(),
                             "token": "f" * 32, "heartbeat_at": time.time(), "ttl_s": 30.0,
                             "generation": 7}
    lease.update(fields)
    os.makedirs(os.path.join(storage, "run"), exist_ok=True)
    with open(os.path.join(storage, "run", LEASE_NAME), "w") as f:
        json.dump(lease, f)


def committed(storage: str) -> list[str]:
    with open(os.path.join(storage, "run", "cairn_run.json")) as f:
        return [c["dir_name"] for c in json.load(f)["checkpoints"]]


def test_a_driver_whose_lease_was_taken_over_stops_committing(
    tmp_path: str, scratch: str
) -> None:
    storage = os.path.join(str(tmp_path), "storage")
    manifest = os.path.join(storage, "run", "checkpoint_000003", MANIFEST_NAME)
    seen: dict[str, list[str]] = {}
    stop = threading.Event()

    def take_over() -> None:
        while not os.path.exists(manifest) and not stop.wait(0.005):
            pass
        # Another driver found this one's heartbeat stale and took the run over.
        write_lease(storage, generation=99)
        seen["at_takeover"] = committed(storage)

    thief = threading.Thread(target=take_over, daemon=True)
    thief.start()
    try:
        with pytest.raises(RunLeaseError, match=r"This driver lost the lease of the run at .* "
                                                r"\(now held by driver host .*, pid \d+\), so "
                                                r"it stopped committing checkpoints"):
            trainer(storage, scratch, steps=200, step_s=0.02).fit()
    finally:
        stop.set()
        thief.join()
    after = committed(storage)
    # At most the commit that had already passed the fence when the lease changed hands.
    assert len(after) <= len(seen["at_takeover"]) + 1
    assert len(after) < 150
    # The new holder's lease is left alone.
    with open(os.path.join(storage, "run", LEASE_NAME)) as f:
        assert json.load(f)["generation"] == 99


@pytest.mark.parametrize("slow_store", [False, True])
def test_two_drivers_started_together_never_both_run(
    slow_store: bool, tmp_path: str, scratch: str
) -> None:
    if slow_store:
        # A custom store without an exclusive create, whose lease writes take a while:
        # both drivers read the lease as free and write it at once.
        root = os.path.join(str(tmp_path), "faultfs")
        storage = fault_store.faultfs_uri(root, slow=LEASE_NAME, slow_s=0.3)
        directory = os.path.join(root, "storage", "run")
    else:
        storage = os.path.join(str(tmp_path), "storage")
        directory = os.path.join(storage, "run")
    drivers = [start_script(SCRIPT, storage, "run", scratch, "--steps", "12", "--step-s",
                            "0.1") for _ in range(2)]
    outputs = [d.communicate(timeout=300)[0].decode() for d in drivers]
    codes = [d.returncode for d in drivers]
    refused = [i for i, out in enumerate(outputs) if "RunLeaseError" in out]
    finished = [i for i, code in enumerate(codes) if code == 0]
    if len(finished) == 2:
        # The second started after the first had finished: the run simply went on.
        pytest.skip("the two drivers did not overlap on this machine")
    assert len(finished) == 1 and len(refused) == 1, outputs
    result = check_run(directory, scratch)
    assert result.metrics == {"step": 11, "loss": 1.0 / 12}


def test_a_stale_lease_of_a_live_pid_is_taken_over(
    tmp_path: str, scratch: str, caplog: pytest.LogCaptureFixture
) -> None:
    storage = os.path.join(str(tmp_path), "storage")
    # The pid is alive (the test's parent), but the heartbeat is far older than the ttl:
    # its driver is gone and the pid was reused.
    write_lease(storage, heartbeat_at=time.time() - 100)
    with caplog.at_level(logging.WARNING):
        result = trainer(storage, scratch, steps=2).fit()
    assert result.metrics == {"step": 1, "loss": 0.5}
    assert "Taking over the lease of a driver that is gone" in caplog.text


@pytest.mark.parametrize(("fields", "problem"), [
    ({"pid": 0}, "its pid is 0"),
    ({"pid": -1}, "its pid is -1"),
    ({"heartbeat_at": time.time() + 10_000}, "in the future, more than its ttl of 30s"),
    ({"ttl_s": 1e9}, "its ttl_s is 1e+09"),
])
def test_an_invalid_lease_is_taken_over(
    fields: dict[str, Any], problem: str, tmp_path: str, scratch: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    storage = os.path.join(str(tmp_path), "storage")
    write_lease(storage, **fields)
    with caplog.at_level(logging.WARNING):
        trainer(storage, scratch, steps=1).fit()
    assert "Taking over an invalid lease" in caplog.text and problem in caplog.text


def test_a_lease_with_wrong_types_is_taken_over(
    tmp_path: str, scratch: str, caplog: pytest.LogCaptureFixture
) -> None:
    storage = os.path.join(str(tmp_path), "storage")
    write_lease(storage, pid="abc")
    with caplog.at_level(logging.WARNING):
        trainer(storage, scratch, steps=1).fit()
    assert "Taking over the lease of" in caplog.text and "pid" in caplog.text


def test_cairn_lease_break_clears_a_lease_the_refusal_names(
    tmp_path: str, scratch: str, capsys: pytest.CaptureFixture[str]
) -> None:
    storage = os.path.join(str(tmp_path), "storage")
    holder = subprocess.Popen(["sleep", "300"])
    try:
        write_lease(storage, pid=holder.pid)
        run = os.path.join(storage, "run")
        with pytest.raises(RunLeaseError, match=rf"is held by another live driver \(host .*, "
                                                rf"pid {holder.pid}\).*`cairn lease break "
                                                rf"{run}` clears it by hand"):
            trainer(storage, scratch, steps=1).fit()
        # The holder's heartbeat is fresh: a plain break refuses, --force removes it.
        assert cli_main(["lease", "break", run]) != 0
        assert "heartbeat" in capsys.readouterr().err
        assert cli_main(["lease", "break", run, "--force"]) == 0
        assert f"was host {socket.gethostname()}, pid {holder.pid}" in capsys.readouterr().out
        assert not os.path.exists(os.path.join(run, LEASE_NAME))
        result = trainer(storage, scratch, steps=1).fit()
        assert result.metrics == {"step": 0, "loss": 1.0}
    finally:
        holder.kill()
        holder.wait()


def test_claims_do_not_pile_up(tmp_path: str, scratch: str) -> None:
    storage = os.path.join(str(tmp_path), "storage")
    make: Callable[[], Trainer] = lambda: trainer(storage, scratch, steps=1)  # noqa: E731
    for _ in range(3):
        make().fit()
    names = os.listdir(os.path.join(storage, "run"))
    assert [n for n in names if n.startswith("_cairn_lease")] == []
    assert LEASE_NAME not in names
