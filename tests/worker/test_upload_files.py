"""A rank's upload of a local checkpoint directory whose files change between its report
and its upload (real files, local storage)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from cairn._src.checkpoint.checkpoint import Checkpoint
from cairn._src.storage.location import resolve
from cairn._src.storage.options import StorageOptions
from cairn._src.wire.messages import ProceedMessage
from cairn._src.worker.report_handle import ReportHandle
from cairn._src.worker.upload_job import UploadJob, upload_files


def job_for(directory: Path, files: dict[str, int]) -> UploadJob:
    return UploadJob(index=1, dir_name="epoch_0", checkpoint=Checkpoint.from_directory(
        str(directory)), files=files, upload_fn=None, delete_local=False,
        handle=ReportHandle(1, has_checkpoint=True), metadata={}, background=True)


def listed(directory: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in directory.iterdir()}


def test_a_file_renamed_after_the_report_is_named_and_the_rest_uploaded(
    tmp_path: Path,
) -> None:
    # Listed at report(): shard_1 and another rank's shard_0.tmp, renamed before the
    # upload read it. The first upload of the directory goes on; the controller decides.
    directory = tmp_path / "epoch_0"
    directory.mkdir()
    (directory / "shard_1").write_bytes(b"one")
    files = {"shard_1": 3, "shard_0.tmp": 0}
    (directory / "shard_0").write_bytes(b"zero")  # renamed from shard_0.tmp
    stored = tmp_path / "run" / "epoch_0"
    stored.mkdir(parents=True)
    (stored / "shard_0.tmp").write_bytes(b"partial")  # as a failed attempt may leave it
    destination = resolve(str(stored))
    message = upload_files(job_for(directory, files), ProceedMessage(1), destination, 1,
                           time.perf_counter(), options=StorageOptions(fsync=False),
                           list_files=lambda: listed(directory))
    assert message.vanished == ("shard_0.tmp",)
    assert sorted(message.entries) == ["shard_1"]
    assert sorted(p.name for p in stored.iterdir()) == ["shard_1"]
    assert (stored / "shard_1").read_bytes() == b"one"


@pytest.mark.parametrize("case", ["directory removed", "relisting upload"])
def test_a_missing_file_still_fails_the_upload(tmp_path: Path, case: str) -> None:
    directory = tmp_path / "epoch_0"
    directory.mkdir()
    (directory / "shard_1").write_bytes(b"one")
    files = {"shard_1": 3, "gone": 2}
    answer = ProceedMessage(1)
    if case == "directory removed":
        shutil.rmtree(directory)
    else:  # the final upload of a shared directory lists it itself: a file gone since fails
        answer = ProceedMessage(1, shared="upload")
        files = {"shard_1": 3, "gone": 2}
    destination = resolve(str(tmp_path / "run" / "epoch_0"))
    with pytest.raises(Exception) as raised:
        upload_files(job_for(directory, files), answer, destination, 1, time.perf_counter(),
                     options=StorageOptions(fsync=False),
                     list_files=lambda: {**listed(directory), "gone": 2})
    assert any(isinstance(e, FileNotFoundError)
               for e in (raised.value, raised.value.__cause__)), raised.value
