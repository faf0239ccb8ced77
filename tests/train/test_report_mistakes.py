"""Mistakes in a checkpoint report that report() or its handle answers with a clear error,
with real worker processes (issue 25 items 10 and 11)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

import pytest
from workloads import run_dir

import cairn
from cairn import Checkpoint, CheckpointUploadMode, ReportError, Trainer, TrainingFailedError
from cairn._src.run.segment_log import read_log
from cairn._src.storage.location import resolve
from cairn._src.storage.retry import RetryPolicy

RunConfigFactory = Callable[..., cairn.RunConfig]


def test_a_reference_holding_a_link_or_fifo_is_refused_by_report_and_the_run_goes_on(
    run_config: RunConfigFactory, scratch: str
) -> None:
    def train(config: dict[str, Any]) -> dict[str, str]:
        errors = {}
        for kind in ("link", "fifo"):
            bad = os.path.join(config["scratch"], f"with_{kind}")
            os.makedirs(os.path.join(bad, "sub"))
            with open(os.path.join(bad, "weights.bin"), "wb") as f:
                f.write(b"w")
            inner = os.path.join(bad, "sub", kind)
            if kind == "link":
                os.symlink(os.path.join(bad, "weights.bin"), inner)
            else:
                os.mkfifo(inner)
            try:
                cairn.report({"step": 0}, checkpoint=Checkpoint(bad),
                             checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD)
            except ReportError as exc:
                errors[kind] = str(exc)
        good = os.path.join(config["scratch"], "good")
        os.makedirs(good)
        with open(os.path.join(good, "weights.bin"), "wb") as f:
            f.write(b"w")
        handle = cairn.report({"step": 1}, checkpoint=Checkpoint(good),
                              checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD)
        assert handle.wait(timeout=120) is not None
        return errors

    result = Trainer(train, train_loop_config={"scratch": scratch},
                     run_config=run_config()).fit()
    errors = result.return_value
    for kind, what in (("link", "a symbolic link"), ("fifo", "a FIFO")):
        inner = os.path.join(scratch, f"with_{kind}", "sub", kind)
        assert errors[kind].startswith("report(checkpoint=Checkpoint("), errors
        assert (f"checkpoint_upload_mode=NO_UPLOAD): {inner!r} is {what}. A checkpoint "
                "registered by reference is read in place and may hold regular files and "
                "directories only") in errors[kind]
    assert result.error is None
    assert result.checkpoint is not None
    assert result.checkpoint.path == os.path.join(scratch, "good")
    assert result.metrics == {"step": 1}
    # The refused reports took no report number: the good one is report 1.
    assert [m["report_index"] for m in result.metrics_dataframe.to_dict("records")] == [1]


def test_an_async_directory_removed_before_its_upload_fails_the_run_at_once(
    run_config: RunConfigFactory, scratch: str, capfd: pytest.CaptureFixture[str]
) -> None:
    def train(config: dict[str, Any]) -> None:
        go = os.path.join(config["scratch"], "go")

        def held_upload(checkpoint: Checkpoint, dir_name: str) -> Checkpoint:
            # Holds the upload thread, so report 2's upload starts only once its
            # directory is gone, however the machine is loaded.
            while not os.path.exists(go):
                time.sleep(0.01)
            destination = os.path.join(config["scratch"], dir_name)
            shutil.copytree(checkpoint.path, destination)
            return Checkpoint(destination)

        first = tempfile.mkdtemp()
        with open(os.path.join(first, "w.bin"), "wb") as f:
            f.write(b"w")
        cairn.report({"step": 0}, checkpoint=Checkpoint(first),
                     checkpoint_upload_mode=CheckpointUploadMode.ASYNC,
                     checkpoint_upload_fn=held_upload)
        # The README's pattern, which ASYNC cannot use: the directory goes at the block's end.
        with tempfile.TemporaryDirectory() as directory:
            with open(os.path.join(directory, "w.bin"), "wb") as f:
                f.write(b"w")
            handle = cairn.report({"step": 1}, checkpoint=Checkpoint(directory),
                                  checkpoint_upload_mode=CheckpointUploadMode.ASYNC)
        with open(os.path.join(config["scratch"], "removed"), "w") as f:
            f.write(directory)
        open(go, "w").close()
        handle.wait(timeout=120)

    config = run_config(failure_config=cairn.FailureConfig(max_failures=2))
    with pytest.raises(TrainingFailedError, match=(
            r"\[rank 0\] ReportError: The checkpoint directory '[^']+' of report 2 \(ASYNC\) "
            r"was removed before the background upload read it\. An ASYNC report\(\) returns "
            r"before the background upload reads the directory, so it must stay until the "
            r"report's handle is done: write the checkpoint into tempfile\.mkdtemp\(\) \(not "
            r"a tempfile\.TemporaryDirectory\(\) block\) and report it with "
            r"delete_local_checkpoint_after_upload=True")) as caught:
        Trainer(train, train_loop_config={"scratch": scratch}, run_config=config).fit()
    with open(os.path.join(scratch, "removed")) as f:
        assert repr(f.read()) in str(caught.value)
    # A mistake a restart would repeat: no restart, and no storage retry either.
    log = read_log(resolve(run_dir(config)).join("events"), RetryPolicy())
    assert sum(e.get("type") == "attempt_start" for e in log) == 1
    assert "Transient error" not in capfd.readouterr().err
    # Report 1, uploaded before, committed.
    assert cairn.Result.from_path(run_dir(config)).checkpoint is not None
