"""A rank's upload of a local checkpoint directory whose files change between its report
and its upload (real files, local storage)."""

from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path

import pytest

from cairn._src.checkpoint.checkpoint import Checkpoint
from cairn._src.storage.checksum import FileEntry
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


@pytest.mark.parametrize("policy", ["fail", "skip"])
def test_a_file_renamed_after_the_report_is_named_and_the_rest_uploaded(
    tmp_path: Path, policy: str
) -> None:
    # Listed at report(): shard_1 and another rank's shard_0.tmp, renamed before the
    # upload read it. The first upload of the directory goes on, and says how it fails
    # unless the controller finds another rank's upload replacing it.
    directory = tmp_path / "epoch_0"
    directory.mkdir()
    (directory / "shard_1").write_bytes(b"one")
    files = {"shard_1": 3, "shard_0.tmp": 0}
    (directory / "shard_0").write_bytes(b"zero")  # renamed from shard_0.tmp
    stored = tmp_path / "run" / "epoch_0"
    stored.mkdir(parents=True)
    job = job_for(directory, files)
    message = upload_files(job, ProceedMessage(1), resolve(str(stored)), 1,
                           time.perf_counter(), options=StorageOptions(fsync=False),
                           policy=policy, list_files=lambda: listed(directory))
    assert message.vanished is not None and message.vanished.paths == ("shard_0.tmp",)
    assert job.vanished
    gone = str(directory / "shard_0.tmp")
    # As the upload would have failed: an ASYNC directory of the rank's own, a mistake
    # that fails the run at once unless the policy skips the report.
    failed = message.vanished.failed
    assert (failed.rank, failed.index) == (1, 1)
    assert failed.error.startswith(
        f"ReportError: {gone!r} of the checkpoint directory {str(directory)!r} of report 1 "
        "(ASYNC) was removed or renamed before the background upload read it.")
    fatal = message.vanished.fatal
    assert (fatal is None) == (policy == "skip")
    assert fatal is None or (fatal.fatal and fatal.error_type == "ReportError")
    assert sorted(message.entries) == ["shard_1"]
    assert sorted(p.name for p in stored.iterdir()) == ["shard_1"]
    assert (stored / "shard_1").read_bytes() == b"one"


def test_a_file_gone_from_a_sync_upload_fails_it_as_a_missing_file(tmp_path: Path) -> None:
    directory = tmp_path / "epoch_0"
    directory.mkdir()
    (directory / "shard_1").write_bytes(b"one")
    job = dataclasses.replace(job_for(directory, {"shard_1": 3, "gone": 1}), background=False)
    message = upload_files(job, ProceedMessage(1), resolve(str(tmp_path / "run")), 0,
                           time.perf_counter(), options=StorageOptions(fsync=False),
                           policy="fail", list_files=lambda: listed(directory))
    assert message.vanished is not None and message.vanished.fatal is None
    assert message.vanished.failed.error == (
        f"FileNotFoundError: [Errno 2] No such file or directory: {str(directory / 'gone')!r}")


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
                     options=StorageOptions(fsync=False), policy="fail",
                     list_files=lambda: {**listed(directory), "gone": 2})
    assert any(isinstance(e, FileNotFoundError)
               for e in (raised.value, raised.value.__cause__)), raised.value


def test_a_directory_renamed_since_the_first_upload_leaves_no_empty_folder(
    tmp_path: Path,
) -> None:
    # The first upload of a shared directory wrote part0.tmp/x; the rank writing it then
    # renamed part0.tmp/ to part0/. The final upload deletes part0.tmp/x, and its folder.
    directory = tmp_path / "epoch_0"
    (directory / "part0").mkdir(parents=True)
    (directory / "part0" / "x").write_bytes(b"x")
    (directory / "keep").mkdir()
    (directory / "keep" / "y").write_bytes(b"y")
    stored = tmp_path / "run" / "epoch_0"
    (stored / "part0.tmp" / "deeper").mkdir(parents=True)
    (stored / "part0.tmp" / "deeper" / "x").write_bytes(b"x")
    (stored / "keep").mkdir()
    (stored / "keep" / "old").write_bytes(b"o")
    stale = {"part0.tmp/deeper/x": FileEntry(1, "stale"), "keep/old": FileEntry(1, "old")}
    message = upload_files(job_for(directory, {}), ProceedMessage(1, shared="upload",
                                                                  stale=stale),
                           resolve(str(stored)), 0, time.perf_counter(),
                           options=StorageOptions(fsync=False), policy="fail",
                           list_files=lambda: {"part0/x": 1, "keep/y": 1})
    assert sorted(message.entries) == ["keep/y", "part0/x"]
    assert sorted(str(p.relative_to(stored)) for p in stored.rglob("*")) == [
        "keep", "keep/y", "part0", "part0/x"]


def test_a_file_another_rank_uploads_gone_before_this_rank_hashed_it_is_named(
    tmp_path: Path,
) -> None:
    # Another machine's rank claimed cfg.tmp first: this rank only hashes its own copy,
    # which its writer renamed meanwhile. As for a file it uploads: named, not a failure.
    directory = tmp_path / "epoch_0"
    directory.mkdir()
    (directory / "shard_1").write_bytes(b"one")
    (directory / "cfg").write_bytes(b"c")  # renamed from cfg.tmp
    job = job_for(directory, {"shard_1": 3, "cfg.tmp": 1})
    message = upload_files(job, ProceedMessage(1, ("cfg.tmp",)),
                           resolve(str(tmp_path / "run" / "epoch_0")), 1, time.perf_counter(),
                           options=StorageOptions(fsync=False), policy="fail",
                           list_files=lambda: listed(directory))
    assert message.vanished is not None and message.vanished.paths == ("cfg.tmp",)
    assert sorted(message.entries) == ["shard_1"] and message.duplicates == {}
    assert job.vanished
