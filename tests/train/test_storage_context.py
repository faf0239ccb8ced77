"""``get_context().get_storage()`` offers what Ray Train's documented
``checkpoint_upload_fn`` code uses, in a real run."""

from __future__ import annotations

from pathlib import Path

import api_workloads
import pytest

from cairn import ConfigError, RunConfig, ScalingConfig, Trainer, UnsafePathError
from cairn._src.storage.location import resolve
from cairn._src.worker.context import RunStorage


def test_ray_checkpoint_upload_fn_pattern(tmp_path: Path) -> None:
    result = Trainer(
        api_workloads.upload_with_storage_context,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="run", storage_path=str(tmp_path)),
    ).fit()
    assert result.checkpoint is not None
    assert api_workloads.load_dict(result.checkpoint) == {"checkpoint_key": "checkpoint_value"}
    assert result.checkpoint.path == str(tmp_path / "run" / "my_checkpoint_dir_name")
    result.checkpoint.verify()
    assert result.return_value == {
        "experiment_fs_path": str(tmp_path / "run"),
        "experiment_dir_name": "run",
        "storage_fs_path": str(tmp_path),
        "filesystem": "local",
        "built": str(tmp_path / "run" / "x"),
    }


def test_storage_paths_on_s3_have_no_scheme(s3_uri_factory: object) -> None:
    uri = s3_uri_factory("ctx")  # type: ignore[operator]
    storage = RunStorage(resolve(uri).join("run"))
    bucket_path = uri.split("?")[0][len("s3://"):]
    assert storage.experiment_fs_path == f"{bucket_path}/run"
    assert storage.storage_fs_path == bucket_path
    assert storage.build_checkpoint_path_from_name("ckpt") == f"{bucket_path}/run/ckpt"
    assert storage.storage_filesystem.type_name == "s3"
    assert storage.extract_checkpoint_dir_name_from_path(f"{bucket_path}/run/ckpt") == "ckpt"


def test_bad_checkpoint_names(tmp_path: Path) -> None:
    storage = RunStorage(resolve(str(tmp_path)).join("run"))
    with pytest.raises(ConfigError, match=r"build_checkpoint_path_from_name\(checkpoint_name=''\)"
                       r": the name must be a non-empty string"):
        storage.build_checkpoint_path_from_name("")
    with pytest.raises(UnsafePathError):
        storage.build_checkpoint_path_from_name("../other_run")
    with pytest.raises(ConfigError, match=r"Checkpoint path /elsewhere/ckpt is not under the "
                       r"experiment directory"):
        storage.extract_checkpoint_dir_name_from_path("/elsewhere/ckpt")
