"""Objects that share a name with a directory on an object store, and files that vanish
while a checkpoint is committed.

Anyone who can write a bucket can put the object ``<run>/checkpoint_000002`` beside the
keys under ``<run>/checkpoint_000002/``, or a "folder" object ``.../w.bin/`` holding bytes
beside the file ``w.bin``: deleting the checkpoint must delete what is under its prefix
and leave that object alone, and a listing that shows ``w.bin`` twice must not make an
intact checkpoint look damaged. Real runs and a real S3-protocol server (moto).
"""

from __future__ import annotations

import io
import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import pytest
from conftest import DICTSTORE_SCHEME, S3_BUCKET, DictStore

import cairn
from cairn._src.errors import MissingCheckpointFileError
from cairn._src.run.layout import INDEX_NAME
from cairn._src.storage.checksum import FileEntry
from cairn._src.storage.fileio import (
    delete_dir,
    delete_file,
    exists,
    list_files,
    read_bytes,
    write_bytes_atomic,
)
from cairn._src.storage.location import StorageLocation, resolve
from cairn._src.storage.retry import RetryPolicy
from cairn._src.storage.transfer import verify_committed
from cairn._src.storage.written import entries_of

RETRY = RetryPolicy(max_attempts=2, initial_backoff_s=0.0)
PLANTED = b"someone else's object"


def s3_client(endpoint: str) -> Any:
    return boto3.client("s3", endpoint_url=f"http://{endpoint}", region_name="us-east-1")


def s3_prefix(uri: str) -> str:
    """The key prefix of an ``s3://cairn-test/...?...`` URI."""
    return uri.split("?")[0][len(f"s3://{S3_BUCKET}/"):]


@pytest.fixture(params=["s3", "dictstore"])
def object_store(request: pytest.FixtureRequest) -> tuple[StorageLocation, Callable[[str], None]]:
    """A fresh base location on an object store, and ``plant(key)``: writes the object
    ``<base>/<key>`` holding :data:`PLANTED` the way another tool would, not through
    Cairn."""
    if request.param == "s3":
        uri = request.getfixturevalue("s3_uri_factory")("prefix")
        client = s3_client(request.getfixturevalue("s3_endpoint"))
        prefix = s3_prefix(uri)

        def plant(key: str) -> None:
            client.put_object(Bucket=S3_BUCKET, Key=f"{prefix}/{key}", Body=PLANTED)

        return resolve(uri), plant
    store: DictStore = request.getfixturevalue("dict_store")
    base = f"bucket/{uuid.uuid4().hex[:10]}"

    def plant_in_dict(key: str) -> None:
        store.write(f"{base}/{key}", io.BytesIO(PLANTED))

    return resolve(f"{DICTSTORE_SCHEME}://{base}"), plant_in_dict


# --- finding: delete_dir deleted an object of the directory's name ---------------------


def test_deleting_a_directory_leaves_the_object_of_its_name(
        object_store: tuple[StorageLocation, Callable[[str], None]]) -> None:
    base, plant = object_store
    directory = base.join("checkpoint_000002")
    write_bytes_atomic(directory.join("s.json"), b"{}", RETRY)
    write_bytes_atomic(directory.join("sub", "w.bin"), b"www", RETRY)
    plant("checkpoint_000002")
    delete_dir(directory, RETRY)
    assert list_files(directory, RETRY) == {}
    assert read_bytes(directory, RETRY) == PLANTED
    delete_dir(directory, RETRY)  # nothing left under it: nothing to do, no error
    assert read_bytes(directory, RETRY) == PLANTED


def test_deleting_a_directory_without_an_object_of_its_name_deletes_it(
        object_store: tuple[StorageLocation, Callable[[str], None]]) -> None:
    base, _ = object_store
    write_bytes_atomic(base.join("ck", "a"), b"a", RETRY)
    write_bytes_atomic(base.join("keep"), b"k", RETRY)
    delete_dir(base.join("ck"), RETRY)
    assert not exists(base.join("ck"), RETRY)
    assert list_files(base, RETRY) == {"keep": 1}


def test_a_link_in_a_directory_s_place_is_removed_itself_never_followed(
        tmp_path: Path) -> None:
    target = tmp_path / "users_copy"
    target.mkdir()
    (target / "precious.txt").write_text("the user's data")
    (tmp_path / "to_dir").symlink_to(target, target_is_directory=True)
    (tmp_path / "to_file").symlink_to(target / "precious.txt")
    for name in ("to_dir", "to_file"):
        delete_dir(resolve(str(tmp_path / name)), RETRY)
        assert not os.path.lexists(tmp_path / name)
    assert (target / "precious.txt").read_text() == "the user's data"


def test_retention_leaves_an_object_named_like_a_checkpoint(
        s3_uri_factory: Callable[[str], str], s3_endpoint: str, scratch: str) -> None:
    storage = s3_uri_factory("retention")
    run = resolve(storage).join("exp")

    def fit(keep: int | None) -> cairn.Result:
        def train() -> None:
            resumed = cairn.get_checkpoint()
            start = 3 if resumed else 1
            for step in range(start, start + 2):
                local = os.path.join(scratch, f"step_{step}")
                os.makedirs(local)
                with open(os.path.join(local, "s.json"), "w") as out:
                    json.dump({"step": step}, out)
                cairn.report({"step": step},
                             checkpoint=cairn.Checkpoint.from_directory(local))

        return cairn.Trainer(train, scaling_config=cairn.ScalingConfig(num_workers=1),
                             run_config=cairn.RunConfig(
                                 name="exp", storage_path=storage, progress=0,
                                 checkpoint_config=cairn.CheckpointConfig(
                                     num_to_keep=keep))).fit()

    assert fit(None).error is None
    s3_client(s3_endpoint).put_object(
        Bucket=S3_BUCKET, Key=f"{s3_prefix(storage)}/exp/checkpoint_000002", Body=PLANTED)
    result = fit(1)
    assert result.error is None and result.metrics == {"step": 4}
    assert read_bytes(run.join("checkpoint_000002"), RETRY) == PLANTED
    assert list_files(run.join("checkpoint_000002"), RETRY) == {}
    assert list_files(run.join("checkpoint_000001"), RETRY) == {}
    assert list_files(run.join("checkpoint_000003"), RETRY) == {}
    index = json.loads(read_bytes(run.join(INDEX_NAME), RETRY))
    assert [c["dir_name"] for c in index["checkpoints"]] == ["checkpoint_000004"]


# --- finding: a path listed twice took the size of the last entry ----------------------


def test_a_path_listed_twice_has_the_size_of_the_file_at_that_path(
        s3_uri_factory: Callable[[str], str], s3_endpoint: str) -> None:
    uri = s3_uri_factory("listed-twice")
    directory = resolve(uri).join("ck")
    write_bytes_atomic(directory.join("w.bin"), b"xxx", RETRY)
    write_bytes_atomic(directory.join("z.bin"), b"z", RETRY)
    s3_client(s3_endpoint).put_object(
        Bucket=S3_BUCKET, Key=f"{s3_prefix(uri)}/ck/w.bin/", Body=b"7 bytes")
    assert list_files(directory, RETRY) == {"w.bin": 3, "z.bin": 1}


def test_an_intact_latest_checkpoint_beside_a_folder_object_is_resumed_from(
        s3_uri_factory: Callable[[str], str], s3_endpoint: str, scratch: str) -> None:
    storage = s3_uri_factory("folder-object")
    resumed_from = os.path.join(scratch, "resumed_from")

    def fit(steps: int) -> cairn.Result:
        def train() -> None:
            resumed = cairn.get_checkpoint()
            if resumed is not None:
                with resumed.as_directory() as directory, \
                        open(os.path.join(directory, "w.bin"), "rb") as weights:
                    with open(resumed_from, "w") as out:
                        out.write(f"{os.path.basename(resumed.path)} {weights.read()!r}")
            for step in range(steps):
                local = os.path.join(scratch, uuid.uuid4().hex)
                os.makedirs(local)
                with open(os.path.join(local, "w.bin"), "wb") as out:
                    out.write(b"w%02d" % step)
                cairn.report({"step": step},
                             checkpoint=cairn.Checkpoint.from_directory(local))

        return cairn.Trainer(train, scaling_config=cairn.ScalingConfig(num_workers=1),
                             run_config=cairn.RunConfig(name="exp", storage_path=storage,
                                                        progress=0)).fit()

    assert fit(2).error is None
    s3_client(s3_endpoint).put_object(
        Bucket=S3_BUCKET, Key=f"{s3_prefix(storage)}/exp/checkpoint_000002/w.bin/",
        Body=b"7 bytes")
    assert fit(1).error is None
    with open(resumed_from) as saved:
        assert saved.read() == "checkpoint_000002 b'w01'"
    index = json.loads(read_bytes(resolve(storage).join("exp", INDEX_NAME), RETRY))
    assert [c["dir_name"] for c in index["checkpoints"]] == [
        "checkpoint_000001", "checkpoint_000002", "checkpoint_000003"]


# --- finding: a file gone during a commit was said to be gone after it -----------------


@pytest.fixture(params=["local", "s3"])
def reference(request: pytest.FixtureRequest, tmp_path: Path) -> StorageLocation:
    """A directory of two files, as a NO_UPLOAD reference on local storage or S3."""
    if request.param == "local":
        location = resolve(str(tmp_path / "reference"))
    else:
        location = resolve(request.getfixturevalue("s3_uri_factory")("reference"))
    for name in ("a.bin", "b.bin"):
        write_bytes_atomic(location.join(name), b"data", RETRY)
    return location


def test_a_file_deleted_while_a_reference_is_committed_is_not_called_committed(
        reference: StorageLocation) -> None:
    # What the driver does to commit a reference: list its files, then hash them.
    names = sorted(list_files(reference, RETRY))
    delete_file(reference.join("b.bin"), RETRY)
    with pytest.raises(MissingCheckpointFileError) as raised:
        entries_of(reference, names, {}, retry=RETRY)
    message = str(raised.value)
    assert "'b.bin'" in message
    assert "before the checkpoint was committed" in message
    assert "after the checkpoint was committed" not in message


def test_a_file_deleted_from_a_committed_checkpoint_is_called_committed(
        reference: StorageLocation) -> None:
    entries = entries_of(reference, sorted(list_files(reference, RETRY)), {}, retry=RETRY)
    delete_file(reference.join("b.bin"), RETRY)
    files: dict[str, FileEntry] = dict(entries)
    with pytest.raises(MissingCheckpointFileError,
                       match=r"'b\.bin'.* after the checkpoint was committed"):
        verify_committed(reference, files, retry=RETRY)
