"""SYNC and ASYNC reports of a checkpoint that is already on a store (S3 on the loopback
S3-protocol server, the example ``xyz://`` custom store): copied store to store into the
run, committed with a manifest of checksums like an uploaded local directory, and the
source kept unless deletion is asked for."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.fs
import pytest

import cairn
from cairn import Checkpoint, CheckpointUploadMode, ScalingConfig, Trainer
from cairn.storage import resolve

RunConfigFactory = Callable[..., cairn.RunConfig]

FILES = {"model.bin": b"weights" * 1000, "nested/optimizer.bin": b"moments" * 300,
         "empty.txt": b""}


def put_directory(uri: str, files: dict[str, bytes]) -> None:
    location = resolve(uri)
    for rel, data in files.items():
        with location.filesystem.open_output_stream(location.join(rel).path) as f:
            f.write(data)


def stored_files(uri: str) -> dict[str, bytes]:
    location = resolve(uri)
    selector = pyarrow.fs.FileSelector(location.path, recursive=True, allow_not_found=True)
    out = {}
    for info in location.filesystem.get_file_info(selector):
        if info.is_file:
            with location.filesystem.open_input_stream(info.path) as f:
                out[info.path[len(location.path.rstrip("/")) + 1:]] = f.read()
    return out


def uri_in(base: str, name: str) -> str:
    """``name`` under ``base``, before its query (the S3 endpoint, the xyz database)."""
    path, mark, query = base.partition("?")
    return f"{path.rstrip('/')}/{name}{mark}{query}"


def make_base(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if kind == "local":
        return str(tmp_path / "storage")
    if kind == "s3":
        factory: Callable[[str], str] = request.getfixturevalue("s3_uri_factory")
        return factory("remote-source")
    pytest.importorskip("xyzstorage", reason="pip install -e examples/xyzstorage")
    return f"xyz://bucket/remote-source?db={tmp_path / 'xyz.db'}"


def report_stored_checkpoints(config: dict[str, Any]) -> None:
    rank = cairn.get_context().get_world_rank()
    # Both ranks report the same directory: identical files are stored once.
    cairn.report({"step": 0}, checkpoint=Checkpoint(config["sync"]))
    handle = cairn.report({"step": 1},
                          checkpoint=Checkpoint(config["async"]) if rank == 0 else None,
                          checkpoint_upload_mode=CheckpointUploadMode.ASYNC)
    assert handle.wait(timeout=120) is not None or rank != 0
    cairn.report({"step": 2}, checkpoint=Checkpoint(config["deleted"]) if rank == 0 else None,
                 checkpoint_upload_mode=CheckpointUploadMode.ASYNC,
                 delete_local_checkpoint_after_upload=True).wait(timeout=120)
    # A committed checkpoint reported again is copied into a new one and never deleted.
    committed = cairn.get_checkpoint()
    assert committed is not None
    cairn.report({"step": 3}, checkpoint=committed if rank == 0 else None,
                 delete_local_checkpoint_after_upload=True)


@pytest.mark.parametrize(("source_kind", "storage_kind"), [("s3", "local"), ("xyz", "s3")])
def test_sync_and_async_copy_a_checkpoint_from_a_store(
    source_kind: str, storage_kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    base = make_base(source_kind, request, tmp_path)
    sources = {name: uri_in(base, name) for name in ("sync", "async", "deleted")}
    for name, uri in sources.items():
        put_directory(uri, {**FILES, "which.txt": name.encode()})
    Checkpoint(sources["sync"]).set_metadata({"epoch": 7})
    storage = make_base(storage_kind, request, tmp_path)
    result = Trainer(
        report_stored_checkpoints, train_loop_config=sources,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=cairn.RunConfig(name="run", storage_path=storage),
    ).fit()
    assert [metrics["step"] for _, metrics in result.best_checkpoints] == [0, 1, 2, 3]
    for (checkpoint, _), name in zip(result.best_checkpoints,
                                     ("sync", "async", "deleted", "deleted"), strict=True):
        checkpoint.verify()
        manifest = checkpoint.get_manifest()
        assert manifest is not None
        assert set(manifest.files) == {*FILES, "which.txt"}
        assert manifest.files["model.bin"].size == len(FILES["model.bin"])
        restored = checkpoint.to_directory(str(tmp_path / f"restored-{name}"))
        for rel, data in {**FILES, "which.txt": name.encode()}.items():
            assert Path(restored, rel).read_bytes() == data
        assert resolve(storage).contains(checkpoint.location)
    assert result.best_checkpoints[0][0].get_metadata() == {"epoch": 7}
    # The ASYNC default deletes a local copy, never the user's data on a store; an explicit
    # delete_local_checkpoint_after_upload=True deletes it, as Ray Train does.
    assert set(stored_files(sources["sync"])) == {*FILES, "which.txt", ".metadata.json"}
    assert set(stored_files(sources["async"])) == {*FILES, "which.txt"}
    assert stored_files(sources["deleted"]) == {}


def report_missing_directory(config: dict[str, Any]) -> None:
    cairn.report({"step": 0}, checkpoint=Checkpoint(config["missing"]))


def test_a_missing_directory_on_a_store_is_refused_at_report(
    run_config: RunConfigFactory, s3_uri_factory: Callable[[str], str]
) -> None:
    missing = uri_in(s3_uri_factory("remote-source"), "never-written")
    with pytest.raises(cairn.TrainingFailedError,
                       match=r"report\(checkpoint=Checkpoint\(.*never-written.*\)\): .*"
                       r"never-written.* does not exist or is not a directory\. Finish "
                       r"writing the checkpoint before reporting it\."):
        Trainer(report_missing_directory, train_loop_config={"missing": missing},
                run_config=run_config()).fit()


def report_the_run_itself(config: dict[str, Any]) -> None:
    cairn.report({"step": 0}, checkpoint=Checkpoint(config["storage"]),
                 checkpoint_upload_mode=CheckpointUploadMode.ASYNC)


def test_a_checkpoint_on_a_store_that_holds_the_run_is_refused(
    s3_uri_factory: Callable[[str], str]
) -> None:
    storage = s3_uri_factory("storage")
    put_directory(uri_in(storage, "notes"), {"a.txt": b"the user's"})
    with pytest.raises(cairn.TrainingFailedError,
                       match=r"Ray Train's experiment directory is contained within the "
                       r"checkpoint path: report\(checkpoint=.*\) passes s3://"):
        Trainer(report_the_run_itself, train_loop_config={"storage": storage},
                run_config=cairn.RunConfig(name="run", storage_path=storage)).fit()
    assert stored_files(uri_in(storage, "notes")) == {"a.txt": b"the user's"}


def return_none_from_upload_fn(config: dict[str, Any]) -> None:
    directory = os.path.join(config["scratch"], "ckpt")
    os.makedirs(directory)
    cairn.report({"step": 0}, checkpoint=Checkpoint.from_directory(directory),
                 checkpoint_upload_fn=lambda checkpoint, name: None)


def test_an_upload_fn_that_returns_no_checkpoint_says_so_in_rays_words_too(
    run_config: RunConfigFactory, scratch: str
) -> None:
    with pytest.raises(cairn.TrainingFailedError,
                       match=r"ReportError: checkpoint_upload_fn must return a "
                       r"`ray.train.Checkpoint`: in Cairn, the cairn.Checkpoint it uploaded; "
                       r"it returned None\."):
        Trainer(return_none_from_upload_fn, train_loop_config={"scratch": scratch},
                run_config=run_config()).fit()
