"""upload_failure_policy="skip" with ranks that share one directory: the first upload of
it fails while another rank is held for it (real worker processes)."""

from __future__ import annotations

import json
import os

import pytest
import shared_dir_faults

import cairn
import cairn.storage
from cairn import CheckpointConfig, ScalingConfig, Trainer


@pytest.fixture(autouse=True)
def _held_store() -> None:
    shared_dir_faults.register()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["SYNC", "ASYNC"])
def test_a_rank_held_for_a_shared_directory_learns_its_report_was_skipped(
    tmp_path: str, scratch: str, mode: str
) -> None:
    # Rank 1 reports the directory first and uploads it at once; rank 0 reports it too
    # and waits for that upload to finish. It fails (no space left): the report is
    # skipped, rank 0 is told so (it uploads nothing) and the run goes on to the next.
    signal = os.path.join(str(tmp_path), "signal")
    os.makedirs(signal)
    uri = shared_dir_faults.held_uri(os.path.join(str(tmp_path), "store"),
                                     fail="checkpoint_000001/shard_1", signal=signal)
    config = cairn.RunConfig(
        name="run", storage_path=uri,
        checkpoint_config=CheckpointConfig(upload_failure_policy="skip"))
    result = Trainer(shared_dir_faults.shards_with_a_failing_first_upload,
                     train_loop_config={"dir": os.path.join(scratch, "shared"),
                                        "signal": signal, "mode": mode},
                     scaling_config=ScalingConfig(num_workers=2), run_config=config).fit()
    assert result.error is None
    said = {"1": "CheckpointSkippedError", "2": "committed"}
    assert result.return_value == said
    for rank in (0, 1):
        with open(os.path.join(signal, f"said_{rank}.json")) as f:
            assert json.load(f) == said, rank
    run = cairn.storage.resolve(uri).join("run")
    names = [c.path.rsplit("/", 1)[-1]
             for c, _ in cairn.Result.from_path(run.uri or run.path).best_checkpoints]
    assert names == ["checkpoint_000002"]
    # Nothing of the skipped checkpoint is left (the store keeps empty folders: no objects).
    leftover = os.path.join(str(tmp_path), "store", "run", "checkpoint_000001")
    assert [files for _, _, files in os.walk(leftover) if files] == []
