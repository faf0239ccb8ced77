"""A snapshot whose state holds something ``torch.save`` cannot pickle (a lambda): its
upload fails with the pickling error, and that is all. The zip writer the failed
serializer leaves behind is finished at once, into nothing; freed later, with the error
that holds it, it once wrote into the closed sink and ended the process (C++
``terminate``, SIGABRT): the driver in local mode, the worker otherwise.

The runs go through a driver in a subprocess, so a process that aborts fails one test
and not the session."""

from __future__ import annotations

import gc
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from cairn._src.worker.shared_state import serialize

DRIVER_SCRIPT = '''
import gc, json, sys
import torch
import cairn
from cairn.torch import TorchTrainer, report_snapshot


def train(config):
    said = {}
    handle = report_snapshot({"step": 1}, {"w": torch.ones(4), "fn": lambda: 0})
    try:
        handle.wait(timeout=120)
        said["1"] = "committed"
    except Exception as exc:
        said["1"] = f"{type(exc).__name__}: {exc}"
    # The failed serializer goes with the handle and its error.
    del handle
    gc.collect()
    report_snapshot({"step": 2}, {"w": torch.ones(4)}).wait(timeout=120)
    gc.collect()
    said["2"] = "committed"
    return said


if __name__ == "__main__":
    num_workers, policy, storage = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    checkpoint_config = cairn.CheckpointConfig(upload_failure_policy=policy)
    try:
        result = TorchTrainer(
            train, scaling_config=cairn.ScalingConfig(num_workers=num_workers),
            run_config=cairn.RunConfig(
                name="run", storage_path=storage, checkpoint_config=checkpoint_config,
                failure_config=cairn.FailureConfig(max_failures=0))).fit()
        outcome = {"return_value": result.return_value,
                   "checkpoint": result.checkpoint.path if result.checkpoint else None}
    except Exception as exc:
        failures = {rank: str(error) for rank, error in getattr(exc, "worker_failures", {}).items()}
        outcome = {"error": type(exc).__name__, "message": str(exc), "failures": failures}
        del exc
    gc.collect()
    print("OUTCOME " + json.dumps(outcome), flush=True)
'''


def run_driver(tmp_path: Path, num_workers: int, policy: str) -> dict[str, Any]:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER_SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(num_workers), policy,
                           str(tmp_path / "storage")],
                          capture_output=True, text=True, timeout=300)
    assert "terminate called" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("OUTCOME ")]
    assert len(lines) == 1, (done.stdout[-3000:], done.stderr[-3000:])
    outcome: dict[str, Any] = json.loads(lines[0].removeprefix("OUTCOME "))
    return outcome


@pytest.mark.parametrize("num_workers", [0, 1], ids=["local_mode", "one_worker"])
def test_an_unpicklable_snapshot_is_skipped_and_the_next_one_commits(
        tmp_path: Path, num_workers: int) -> None:
    outcome = run_driver(tmp_path, num_workers, "skip")
    assert "error" not in outcome, outcome
    said = outcome["return_value"]
    assert said["1"].startswith("CheckpointSkippedError: The checkpoint of report 1 was "
                                "skipped: "), said
    assert "Can't pickle" in said["1"], said
    assert said["2"] == "committed", said
    assert outcome["checkpoint"].endswith("checkpoint_000002"), outcome
    state = torch.load(Path(outcome["checkpoint"]) / "state.pt", weights_only=True)
    assert torch.equal(state["w"], torch.ones(4))
    assert not (tmp_path / "storage" / "run" / "checkpoint_000001").exists()


@pytest.mark.parametrize("num_workers", [0, 1], ids=["local_mode", "one_worker"])
def test_an_unpicklable_snapshot_fails_the_run_with_the_pickling_error(
        tmp_path: Path, num_workers: int) -> None:
    outcome = run_driver(tmp_path, num_workers, "fail")
    assert outcome.get("error") == "WorkerGroupError", outcome
    assert "[rank 0] The upload of report 1's checkpoint failed" in outcome["message"], outcome
    assert "Can't pickle" in outcome["message"], outcome
    assert "killed by" not in outcome["message"], outcome
    assert list(outcome["failures"]) == ["0"], outcome
    assert "Can't pickle" in outcome["failures"]["0"], outcome


class _Recording(io.BytesIO):
    """A sink that counts the writes it gets after it is closed (instead of raising)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes_after_close = 0
        self.closed_here = False

    def write(self, data: Any) -> int:
        if self.closed_here:
            self.writes_after_close += 1
            return len(memoryview(data).cast("B"))
        return super().write(data)


def test_a_serialize_the_pickler_stops_leaves_nothing_to_write_when_it_is_freed() -> None:
    sink = _Recording()
    try:
        serialize({"w": torch.ones(4), "fn": lambda: 0}, sink)
    except Exception as exc:  # the traceback holds serialize's frame, and its writer
        assert "pickle" in str(exc).lower(), exc
        sink.closed_here = True
    else:
        raise AssertionError("serialize pickled a lambda")
    gc.collect()  # the error and its frames are gone: the writer is freed
    assert sink.writes_after_close == 0
