"""A committed checkpoint's metadata travels with it, as Ray Train's ``.metadata.json``
does: a local copy (``to_directory``, ``as_directory`` of a remote one) holds it as that
file, and a report of the committed checkpoint or of a copy keeps it, merged with later
``set_metadata`` / ``update_metadata`` calls. On storage the manifest stays its only
home: no checkpoint stores ``.metadata.json`` as a data file.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import cairn
from cairn import ScalingConfig, Trainer
from cairn._src.checkpoint.checkpoint import METADATA_FILE_NAME, Checkpoint
from cairn._src.checkpoint.manifest import MANIFEST_NAME, Manifest, write_manifest
from cairn._src.storage.location import resolve
from cairn._src.storage.transfer import upload_directory

METADATA = {"epoch": 3, "lr": 0.5}


def tree(directory: str | Path) -> list[str]:
    return sorted(os.path.relpath(os.path.join(root, name), directory)
                  for root, _, names in os.walk(directory) for name in names)


def commit(tmp_path: Path, where: str, metadata: dict[str, Any]) -> Checkpoint:
    """A checkpoint committed at ``where`` (a path or URI) with ``metadata``."""
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True, exist_ok=True)
    (src / "model.txt").write_text("m")
    (src / "sub" / "b.txt").write_text("b")
    location = resolve(where)
    write_manifest(location, Manifest(files=upload_directory(str(src), location),
                                      metadata=metadata))
    return Checkpoint(where)


def test_to_directory_of_a_committed_checkpoint_writes_its_metadata(tmp_path: Path) -> None:
    checkpoint = commit(tmp_path, str(tmp_path / "ckpt"), METADATA)
    copy = checkpoint.to_directory(tmp_path / "copy")
    assert tree(copy) == [METADATA_FILE_NAME, "model.txt", "sub/b.txt"]
    assert Checkpoint.from_directory(copy).get_metadata() == METADATA
    # The stored checkpoint is unchanged: its metadata lives in the manifest only.
    assert tree(tmp_path / "ckpt") == [MANIFEST_NAME, "model.txt", "sub/b.txt"]
    manifest = checkpoint.get_manifest()
    assert manifest is not None and METADATA_FILE_NAME not in manifest.files
    checkpoint.verify()


def test_a_copy_of_a_remote_checkpoint_holds_its_metadata(tmp_path: Path) -> None:
    checkpoint = commit(tmp_path, "memory://metadata-travels/ckpt", METADATA)
    with checkpoint.as_directory() as directory:
        assert tree(directory) == [METADATA_FILE_NAME, "model.txt", "sub/b.txt"]
        assert Checkpoint.from_directory(directory).get_metadata() == METADATA
    default = checkpoint.to_directory()
    assert Checkpoint.from_directory(default).get_metadata() == METADATA


def test_a_checkpoint_without_metadata_is_copied_without_the_file(tmp_path: Path) -> None:
    checkpoint = commit(tmp_path, str(tmp_path / "ckpt"), {})
    copy = checkpoint.to_directory(tmp_path / "copy")
    assert tree(copy) == ["model.txt", "sub/b.txt"]
    assert Checkpoint.from_directory(copy).get_metadata() == {}


def report_with_metadata_or_again(config: dict[str, Any]) -> None:
    """First fit: a checkpoint with metadata. Second fit: the restored checkpoint reported
    as it is, then a copy of it with more metadata."""
    previous = cairn.get_checkpoint()
    if previous is None:
        with tempfile.TemporaryDirectory() as directory:
            Path(directory, "model.txt").write_text("m")
            checkpoint = Checkpoint.from_directory(directory)
            checkpoint.set_metadata({"epoch": 3})
            checkpoint.update_metadata({"lr": 0.5})
            cairn.report({"step": 1}, checkpoint=checkpoint)
        return
    cairn.report({"step": 2}, checkpoint=previous)
    copy = Checkpoint.from_directory(previous.to_directory())
    copy.update_metadata({"note": "copy"})
    cairn.report({"step": 3}, checkpoint=copy)


def test_a_reported_committed_checkpoint_or_copy_keeps_its_metadata(run_config: Any) -> None:
    def fit() -> cairn.Result:
        return Trainer(report_with_metadata_or_again, scaling_config=ScalingConfig(num_workers=1),
                       run_config=run_config()).fit()

    first = fit().checkpoint
    assert first is not None and first.get_metadata() == METADATA
    first.update_metadata({"note": "x"})  # on the committed one: rewrites its manifest
    result = fit()
    metadata = {metrics["step"]: checkpoint.get_metadata()
                for checkpoint, metrics in result.best_checkpoints}
    assert metadata == {
        1: {**METADATA, "note": "x"},
        2: {**METADATA, "note": "x"},
        3: {**METADATA, "note": "copy"},
    }
    for checkpoint, _ in result.best_checkpoints:
        checkpoint.verify()
        assert tree(checkpoint.path) == [MANIFEST_NAME, "model.txt"]
