"""Mistakes in a checkpoint report that report() or its handle answers with a clear error,
with real worker processes (issue 25 items 10 and 11)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import cairn
from cairn import Checkpoint, CheckpointUploadMode, ReportError, Trainer

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
