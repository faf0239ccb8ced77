"""Checkpoint: Ray Train's API over local and remote storage, plus commit and verify."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import cloudpickle
import fsspec
import pyarrow.fs as pafs
import pytest

from cairn._src.checkpoint.checkpoint import METADATA_FILE_NAME, Checkpoint
from cairn._src.checkpoint.manifest import MANIFEST_NAME, Manifest, write_manifest
from cairn._src.errors import (
    CheckpointNotFoundError,
    ChecksumMismatchError,
    ConfigError,
    ManifestError,
    NotADirectoryCheckpointError,
)
from cairn._src.storage import fileio
from cairn._src.storage.location import StorageLocation, resolve
from cairn._src.storage.transfer import upload_directory


@pytest.fixture
def local_dir(tmp_path: Path) -> Path:
    root = tmp_path / "local_ckpt"
    (root / "model").mkdir(parents=True)
    (root / "model" / "weights.pt").write_bytes(b"w" * 1000)
    (root / "step.txt").write_bytes(b"42")
    return root


def commit(local: Path, where: StorageLocation, **fields: object) -> Manifest:
    """Upload ``local`` to ``where`` and write its manifest, as the controller does."""
    entries = upload_directory(str(local), where)
    manifest = Manifest(files=entries, **fields)  # type: ignore[arg-type]
    write_manifest(where, manifest)
    return manifest


def test_local_checkpoint_is_used_in_place(local_dir: Path) -> None:
    checkpoint = Checkpoint.from_directory(local_dir)
    assert checkpoint.path == str(local_dir)
    assert isinstance(checkpoint.filesystem, pafs.LocalFileSystem)
    assert checkpoint.uri == str(local_dir)
    with checkpoint.as_directory() as directory:
        assert directory == str(local_dir)
    assert local_dir.exists()  # Not deleted: it was never a copy.


def test_to_directory_copies_an_uncommitted_checkpoint(local_dir: Path, tmp_path: Path) -> None:
    checkpoint = Checkpoint(str(local_dir))
    checkpoint.set_metadata({"epoch": 1})
    target = checkpoint.to_directory(tmp_path / "copy")
    assert target == str(tmp_path / "copy")
    assert sorted(os.listdir(target)) == [METADATA_FILE_NAME, "model", "step.txt"]
    default = checkpoint.to_directory()
    try:
        assert (Path(default) / "model" / "weights.pt").read_bytes() == b"w" * 1000
    finally:
        shutil.rmtree(default)


def test_metadata_of_an_uncommitted_checkpoint(local_dir: Path) -> None:
    checkpoint = Checkpoint(str(local_dir))
    assert checkpoint.get_metadata() == {}
    checkpoint.set_metadata({"a": 1, "b": [1, 2]})
    checkpoint.update_metadata({"b": None, "c": "x"})
    assert checkpoint.get_metadata() == {"a": 1, "b": None, "c": "x"}
    assert (local_dir / METADATA_FILE_NAME).exists()
    assert checkpoint.get_manifest() is None


@pytest.mark.parametrize(
    ("metadata", "match"),
    [
        ({"path": Path("/x")}, r"metadata must be JSON-serializable.*PosixPath"),
        ({1: "int key"}, r"metadata=\{1: 'int key'\} must be a dict with str keys"),
        (["not", "a", "dict"], r"metadata=\['not', 'a', 'dict'\] must be a dict"),
    ],
)
def test_metadata_must_be_json(local_dir: Path, metadata: object, match: str) -> None:
    checkpoint = Checkpoint(str(local_dir))
    with pytest.raises(ConfigError, match=match):
        checkpoint.set_metadata(metadata)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=match):
        checkpoint.update_metadata(metadata)  # type: ignore[arg-type]
    assert not (local_dir / METADATA_FILE_NAME).exists()


def test_damaged_metadata_file(local_dir: Path) -> None:
    (local_dir / METADATA_FILE_NAME).write_text("{oops")
    with pytest.raises(ManifestError, match=r"\.metadata\.json is not valid JSON"):
        Checkpoint(str(local_dir)).get_metadata()


def test_missing_checkpoint(tmp_path: Path) -> None:
    checkpoint = Checkpoint(str(tmp_path / "nope"))  # Constructing touches nothing.
    with pytest.raises(CheckpointNotFoundError, match=r"nope does not exist"):
        checkpoint.to_directory(tmp_path / "out")
    with pytest.raises(CheckpointNotFoundError, match="does not exist"):
        with checkpoint.as_directory():
            pass
    with pytest.raises(CheckpointNotFoundError, match="does not exist"):
        checkpoint.set_metadata({"a": 1})
    remote = Checkpoint("memory://nothing/here")
    with pytest.raises(CheckpointNotFoundError, match=r"memory://nothing/here does not exist"):
        remote.to_directory(tmp_path / "out2")


def test_file_instead_of_directory(local_dir: Path, tmp_path: Path) -> None:
    checkpoint = Checkpoint(str(local_dir / "step.txt"))
    with pytest.raises(NotADirectoryCheckpointError, match="is a file, not a directory"):
        checkpoint.to_directory(tmp_path / "out")
    with pytest.raises(NotADirectoryCheckpointError, match="is a file, not a directory"):
        with checkpoint.as_directory():
            pass


def test_committed_remote_checkpoint(local_dir: Path, tmp_path: Path) -> None:
    where = resolve("memory://ckpt-tests/committed")
    commit(local_dir, where, metadata={"m": 1}, report_index=3)
    checkpoint = Checkpoint("memory://ckpt-tests/committed")
    checkpoint.verify()
    assert checkpoint.get_metadata() == {"m": 1}
    checkpoint.update_metadata({"n": 2})
    manifest = checkpoint.get_manifest()
    assert manifest is not None and manifest.metadata == {"m": 1, "n": 2}
    assert manifest.report_index == 3
    with checkpoint.as_directory() as directory:
        assert (Path(directory) / "step.txt").read_bytes() == b"42"
        assert not (Path(directory) / MANIFEST_NAME).exists()
    assert not os.path.exists(directory)  # The temporary copy is gone.


def test_corruption_is_caught_on_restore(local_dir: Path, tmp_path: Path) -> None:
    where = resolve("memory://ckpt-tests/corrupt")
    commit(local_dir, where)
    fileio.write_bytes_atomic(where.join("step.txt"), b"43")
    checkpoint = Checkpoint(where.uri)  # type: ignore[arg-type]
    with pytest.raises(ChecksumMismatchError, match=r"'step\.txt' .* is corrupt"):
        checkpoint.verify()
    with pytest.raises(ChecksumMismatchError, match=r"'step\.txt' .* is corrupt"):
        checkpoint.to_directory(tmp_path / "out")
    assert not (tmp_path / "out" / "step.txt").exists()
    before = set(os.listdir(os.environ.get("TMPDIR", "/tmp")))
    with pytest.raises(ChecksumMismatchError):
        with checkpoint.as_directory():
            pass
    after = set(os.listdir(os.environ.get("TMPDIR", "/tmp")))
    assert not {name for name in after - before if name.startswith("cairn-checkpoint-")}


def test_verify_needs_a_valid_manifest(local_dir: Path) -> None:
    checkpoint = Checkpoint(str(local_dir))
    with pytest.raises(ManifestError, match="has no manifest"):
        checkpoint.verify()
    (local_dir / MANIFEST_NAME).write_text('{"version": 99}')
    with pytest.raises(ManifestError, match="has version 99; this Cairn reads versions 1"):
        checkpoint.verify()


def test_deleted_file_is_caught_by_verify(local_dir: Path) -> None:
    where = resolve(str(local_dir.parent / "committed"))
    commit(local_dir, where)
    os.remove(local_dir.parent / "committed" / "model" / "weights.pt")
    with pytest.raises(CheckpointNotFoundError, match=r"model/weights\.pt"):
        Checkpoint(where.path).verify()


def test_checkpoint_registered_by_reference(local_dir: Path, tmp_path: Path) -> None:
    data = resolve("memory://elsewhere/reference")
    entries = upload_directory(str(local_dir), data)
    manifest_dir = resolve(str(tmp_path / "run" / "checkpoint_000000"))
    write_manifest(manifest_dir, Manifest(files=entries, target_uri=data.uri))
    checkpoint = Checkpoint._from_committed(data, manifest_location=manifest_dir)
    assert checkpoint.uri == "memory://elsewhere/reference"
    checkpoint.verify()
    checkpoint.set_metadata({"ref": True})
    assert not fileio.exists(data.join(MANIFEST_NAME))  # The data stays untouched.
    again = pickle.loads(pickle.dumps(checkpoint))
    assert again.get_metadata() == {"ref": True}
    assert (Path(again.to_directory(tmp_path / "out")) / "step.txt").read_bytes() == b"42"


def test_equality_and_hash(tmp_path: Path) -> None:
    a = Checkpoint(str(tmp_path / "x"))
    same = [
        Checkpoint(f"file://{tmp_path}/x"),
        Checkpoint(str(tmp_path / "x") + "/"),
        Checkpoint(str(tmp_path / "x"), filesystem=pafs.LocalFileSystem()),
        Checkpoint.from_directory(tmp_path / "x"),
    ]
    for other in same:
        assert other == a and hash(other) == hash(a)
    assert Checkpoint(str(tmp_path / "y")) != a
    assert len({a, *same}) == 1
    assert a != "not a checkpoint"


def test_repr_is_redacted() -> None:
    checkpoint = Checkpoint(
        "s3://AKIA:TOPSECRET@bkt/run/ck?endpoint_override=127.0.0.1:1&scheme=http&region=eu"
    )
    assert "TOPSECRET" not in repr(checkpoint)
    assert repr(checkpoint).startswith(
        "Checkpoint(filesystem=s3, path=bkt/run/ck, uri='s3://AKIA:***@bkt/run/ck")


def test_repr_is_ray_trains_for_a_local_checkpoint(tmp_path: Path) -> None:
    assert repr(Checkpoint(str(tmp_path))) == f"Checkpoint(filesystem=local, path={tmp_path})"


def test_pickling_follows_the_location(local_dir: Path) -> None:
    by_uri = Checkpoint("memory://ckpt-tests/pickled")
    assert pickle.loads(pickle.dumps(by_uri)) == by_uri

    explicit = Checkpoint("/explicit/ck", filesystem=fsspec.filesystem("memory"))
    fileio.write_bytes_atomic(explicit.location.join("f"), b"1")
    again = pickle.loads(pickle.dumps(explicit))
    assert again.uri is None and fileio.read_bytes(again.location.join("f")) == b"1"

    made = Checkpoint("/factory/ck", filesystem=lambda: fsspec.filesystem("memory"))
    assert cloudpickle.loads(cloudpickle.dumps(made)).path == "/factory/ck"


def test_object_store_checkpoint_round_trip(
    local_dir: Path, tmp_path: Path, dict_store: object
) -> None:
    where = resolve("dictstore://bucket/ck-roundtrip")
    commit(local_dir, where, metadata={"k": "v"})
    checkpoint = Checkpoint("dictstore://bucket/ck-roundtrip")
    restored = Path(checkpoint.to_directory(tmp_path / "restored"))
    assert (restored / "model" / "weights.pt").read_bytes() == b"w" * 1000
    assert checkpoint.get_metadata() == {"k": "v"}
