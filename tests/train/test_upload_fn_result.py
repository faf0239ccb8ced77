"""What a ``checkpoint_upload_fn`` returns is checked as a NO_UPLOAD checkpoint is.

A returned run directory (Cairn's own data), a directory that does not exist or a file is
refused with a ReportError that names the function and what it returned. Like a NO_UPLOAD
report of such a place, it is a mistake a restart would repeat: the run fails at once,
nothing is committed for that report, and the next fit() resumes from the checkpoint
before it. The report's own directory in the run, where such a function writes, stays
accepted.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import pytest

import cairn
from cairn import Checkpoint, FailureConfig, ScalingConfig, Trainer
from cairn._src.errors import WorkerGroupError
from cairn._src.run.events import Failure, read_events
from cairn._src.storage.location import resolve
from cairn._src.storage.retry import RetryPolicy

RunConfigFactory = Callable[..., cairn.RunConfig]


def _train(config: dict[str, Any]) -> None:
    """Three steps, each reported through an upload function that writes the report's
    own directory in the run; the first attempt's step 1 returns ``config["wrong"]``."""
    scratch = config["scratch"]
    storage = cairn.get_context().get_storage()

    def upload(checkpoint: Checkpoint, dir_name: str) -> Checkpoint:
        destination = storage.build_checkpoint_path_from_name(dir_name)
        shutil.copytree(checkpoint.path, destination, dirs_exist_ok=True)
        return Checkpoint(destination)

    def wrong(checkpoint: Checkpoint, dir_name: str) -> Checkpoint:
        upload(checkpoint, dir_name)
        if config["wrong"] == "run":
            return Checkpoint(storage.run_path)
        path = os.path.join(scratch, "returned")
        if config["wrong"] == "file":
            with open(path, "w") as f:
                f.write("not a directory")
        return Checkpoint(path)

    start = 0
    restored = cairn.get_checkpoint()
    if restored is not None:
        with restored.as_directory() as directory:
            start = int(open(os.path.join(directory, "state")).read()) + 1
        with open(os.path.join(scratch, "resumed_at"), "w") as f:
            f.write(str(start))
    for step in range(start, 3):
        directory = tempfile.mkdtemp()
        with open(os.path.join(directory, "state"), "w") as f:
            f.write(str(step))
        first = not os.path.exists(os.path.join(scratch, "refused"))
        if step == 1 and first:
            open(os.path.join(scratch, "refused"), "w").close()
        function = wrong if step == 1 and first else upload
        cairn.report({"step": step}, checkpoint=Checkpoint.from_directory(directory),
                     checkpoint_upload_fn=function)


@pytest.mark.parametrize(("wrong", "expected"), [
    ("run", r"returned Checkpoint\(filesystem=local, path=(?P<run>.+)\): (?P=run) is the run "
            r"directory (?P=run)\. .+ may not contain Cairn's data"),
    ("missing", r"returned Checkpoint\(filesystem=local, path=.+/returned\): .+/returned does "
                r"not exist or is not a directory\. checkpoint_upload_fn must return the "
                r"directory it uploaded the checkpoint to"),
    ("file", r"returned Checkpoint\(filesystem=local, path=.+/returned\): .+/returned does "
             r"not exist or is not a directory\. checkpoint_upload_fn must return the "
             r"directory it uploaded the checkpoint to"),
])
def test_a_wrong_upload_fn_result_is_refused_and_the_run_resumes(
    wrong: str, expected: str, run_config: RunConfigFactory, scratch: str,
) -> None:
    config = run_config(failure_config=FailureConfig(max_failures=1))

    def fit() -> cairn.Result:
        return Trainer(_train, train_loop_config={"scratch": scratch, "wrong": wrong},
                       scaling_config=ScalingConfig(num_workers=1), run_config=config).fit()

    with pytest.raises(WorkerGroupError) as raised:
        fit()
    assert "ReportError: The checkpoint_upload_fn of report 2 returned" in str(raised.value)
    assert "after retries" not in str(raised.value), "a mistake is never retried"
    assert re.search(expected, str(raised.value)) is not None, str(raised.value)

    assert config.storage_path is not None and config.name is not None
    run = os.path.join(os.fspath(config.storage_path), config.name)
    failures = [event for event in read_events(resolve(os.path.join(run, "events")),
                                               RetryPolicy()) if isinstance(event, Failure)]
    assert len(failures) == 1, "fatal: the budget (max_failures=1) is not spent on it"
    reason = failures[0].reason or ""
    assert "ReportError: The checkpoint_upload_fn of report 2 returned" in reason
    assert not os.path.exists(os.path.join(scratch, "resumed_at"))
    assert [m["step"] for _, m in cairn.Result.from_path(run).best_checkpoints] == [0]

    result = fit()
    assert result.error is None

    # Nothing was committed for the refused report: the next fit() resumed after step 0.
    assert open(os.path.join(scratch, "resumed_at")).read() == "1"
    committed = result.best_checkpoints
    assert [metrics["step"] for _, metrics in committed] == [0, 1, 2]
    for checkpoint, _ in committed:
        assert os.path.dirname(checkpoint.path) == run
        checkpoint.verify()
    assert result.checkpoint is not None
    with result.checkpoint.as_directory() as directory:
        assert open(os.path.join(directory, "state")).read() == "2"

