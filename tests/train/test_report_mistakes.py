"""Mistakes in a checkpoint report that report() or its handle answers with a clear error,
with real worker processes (issue 25 items 10 and 11)."""

from __future__ import annotations

import os
import re
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



def _a_file_removed_before_its_upload(config: dict[str, Any]) -> dict[str, str]:
    """Three reports, each of a directory of this rank alone; report 2 loses ``b.bin``
    after report() listed it and before its upload reads it (an ASYNC upload waits behind
    report 1's, held until the file is gone; a SYNC one removes it on its way in). What
    each report's handle said."""
    import cairn._src.worker.upload_job as upload_job

    mode = CheckpointUploadMode[config["mode"]]
    go = os.path.join(config["scratch"], "go")
    real_upload = upload_job.upload_directory
    victim: list[str] = []

    def upload_directory(local_dir: str, destination: Any, **kwargs: Any) -> Any:
        if victim and local_dir == victim[0]:
            os.remove(os.path.join(victim.pop(), "b.bin"))
        return real_upload(local_dir, destination, **kwargs)

    def held_upload(checkpoint: Checkpoint, dir_name: str) -> Checkpoint:
        while not os.path.exists(go):
            time.sleep(0.01)
        return checkpoint

    upload_job.upload_directory = upload_directory  # type: ignore[assignment]
    handles = {}
    for step in (1, 2, 3):
        directory = os.path.join(config["scratch"],
                                 f"attempt{cairn.get_context().get_attempt()}_step{step}")
        os.makedirs(directory)
        for name in ("a.bin", "b.bin"):
            with open(os.path.join(directory, name), "wb") as f:
                f.write(name.encode() * 100)
        if mode is CheckpointUploadMode.SYNC and step == 2 and not os.path.exists(go):
            victim.append(directory)
            open(go, "w").close()  # once: a restart's report 2 keeps its files
        held = mode is CheckpointUploadMode.ASYNC and step == 1
        try:
            handles[step] = cairn.report({"step": step}, checkpoint=Checkpoint(directory),
                                         checkpoint_upload_mode=mode,
                                         checkpoint_upload_fn=held_upload if held else None)
        except Exception as exc:  # a SYNC report() raises what its upload failed with
            handles[step] = exc
        if mode is CheckpointUploadMode.ASYNC and step == 2:
            os.remove(os.path.join(directory, "b.bin"))
            open(go, "w").close()
    said = {}
    for step, handle in handles.items():
        try:
            if isinstance(handle, Exception):
                raise handle
            handle.wait(timeout=120)
            said[str(step)] = "committed"
        except Exception as exc:
            said[str(step)] = f"{type(exc).__name__}: {exc}"
    return said


@pytest.mark.parametrize("mode", ["ASYNC", "SYNC"])
def test_a_file_removed_from_a_directory_before_its_upload_is_skipped_under_the_skip_policy(
    run_config: RunConfigFactory, scratch: str, mode: str
) -> None:
    config = run_config(checkpoint_config=cairn.CheckpointConfig(
        upload_failure_policy="skip"))
    result = Trainer(_a_file_removed_before_its_upload,
                     train_loop_config={"scratch": scratch, "mode": mode},
                     run_config=config).fit()
    assert result.error is None
    said = result.return_value
    assert said["1"] == said["3"] == "committed", said
    assert said["2"].startswith("CheckpointSkippedError: The checkpoint of report 2 was "
                                "skipped"), said
    assert "b.bin" in said["2"], said
    log = read_log(resolve(run_dir(config)).join("events"), RetryPolicy())
    assert sum(e.get("type") == "attempt_start" for e in log) == 1
    assert result.metrics == {"step": 3}
    # The report's own directory stays with the user (its upload failed).
    assert os.listdir(os.path.join(scratch, "attempt0_step2")) == ["a.bin"]


def test_a_file_removed_from_an_async_directory_before_its_upload_fails_the_run_at_once(
    run_config: RunConfigFactory, scratch: str
) -> None:
    config = run_config(failure_config=cairn.FailureConfig(max_failures=2))
    directory = os.path.join(scratch, "attempt0_step2")
    with pytest.raises(TrainingFailedError, match=(
            r"\[rank 0\] ReportError: " + re.escape(
                f"{os.path.join(directory, 'b.bin')!r} of the checkpoint directory "
                f"{directory!r} of report 2 (ASYNC) was removed or renamed before the "
                "background upload read it. An ASYNC report() returns before"))):
        Trainer(_a_file_removed_before_its_upload,
                train_loop_config={"scratch": scratch, "mode": "ASYNC"},
                run_config=config).fit()
    log = read_log(resolve(run_dir(config)).join("events"), RetryPolicy())
    assert sum(e.get("type") == "attempt_start" for e in log) == 1
    assert os.listdir(directory) == ["a.bin"]


def test_a_file_removed_from_a_sync_directory_before_its_upload_fails_the_attempt(
    run_config: RunConfigFactory, scratch: str
) -> None:
    # A storage failure of that upload, not a mistake of the train function: restarted.
    config = run_config(failure_config=cairn.FailureConfig(max_failures=2))
    result = Trainer(_a_file_removed_before_its_upload,
                     train_loop_config={"scratch": scratch, "mode": "SYNC"},
                     run_config=config).fit()
    assert result.error is None
    assert result.return_value == {"1": "committed", "2": "committed", "3": "committed"}
    log = read_log(resolve(run_dir(config)).join("events"), RetryPolicy())
    assert sum(e.get("type") == "attempt_start" for e in log) == 2
    failures = [e for e in log if e.get("type") == "failure"]
    assert failures and "b.bin" in str(failures[0]), failures
