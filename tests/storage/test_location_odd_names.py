"""Names that a URI cannot carry, and ``.``/``..`` in paths on remote storage.

A run named ``a#b`` on a custom scheme got URIs that named run ``a`` (``cairn prune`` given
``Result.uri`` pruned the other run), and an S3 ``storage_path`` with a ``..`` component
had every ``fit()`` write over the run's metrics history and event log, as pyarrow
resolves ``..`` in object keys but not in listing prefixes.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from conftest import S3_BUCKET, STORAGE_KINDS, make_storage_uri

import cairn
from cairn import Checkpoint, ConfigError, RunConfig, ScalingConfig, Trainer
from cairn._src.storage import location
from cairn._src.storage.location import resolve

ODD_NAMES = ("a#b", "a?b", "a%23b", "a b", "a&db=x")


@pytest.mark.parametrize("kind", STORAGE_KINDS)
@pytest.mark.parametrize("name", ODD_NAMES)
def test_a_joined_uri_names_the_joined_place_or_there_is_none(
        kind: str, name: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    base = resolve(make_storage_uri(request, kind, tmp_path))
    run = base.join(name)
    for joined in (run, run.join("checkpoint_000001"), run.join("checkpoint_000001", name)):
        if joined.uri is None:
            # Only where no URI of the scheme can name the place (never on s3 or a disk).
            assert kind in ("memory", "dictstore", "xyz") and set("?#") & set(name)
            continue
        assert resolve(joined.uri).path == joined.path


def test_which_schemes_carry_question_marks_and_hashes() -> None:
    uri_can_carry = location.uri_can_carry
    for scheme in (None, "file", "s3", "gs", "gcs", "hdfs", "viewfs"):
        assert uri_can_carry(scheme, "a?b#c")
    for scheme in ("xyz", "memory", "dictstore", "az"):
        assert not uri_can_carry(scheme, "a?b")
        assert not uri_can_carry(scheme, "a#b")
        assert uri_can_carry(scheme, "a%23b c&d")


def _write_files(config: dict[str, str]) -> None:
    directory = tempfile.mkdtemp()
    with open(os.path.join(directory, config["file"]), "w") as f:
        json.dump({"file": config["file"]}, f)
    cairn.report({"x": 1}, checkpoint=Checkpoint.from_directory(directory))


@pytest.mark.parametrize("file_name", ["w#1.json", "w?1.json"])
def test_files_whose_names_no_uri_carries_still_upload_and_restore(
        file_name: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    storage = make_storage_uri(request, "xyz", tmp_path)
    result = Trainer(_write_files, train_loop_config={"file": file_name},
                     scaling_config=ScalingConfig(num_workers=1),
                     run_config=RunConfig(name="run", storage_path=storage)).fit()
    assert result.error is None
    assert result.checkpoint is not None
    with result.checkpoint.as_directory() as directory:
        assert os.listdir(directory) == [file_name]
        with open(os.path.join(directory, file_name)) as f:
            assert json.load(f) == {"file": file_name}


DOTS = r"has the path component '{}', which only a local disk resolves reliably; accepted: "


@pytest.mark.parametrize(("path", "component"), [
    ("team/../runs", ".."), ("./runs", "."), ("runs/.", "."), ("runs/..", ".."),
])
@pytest.mark.parametrize("kind", ["s3", "memory", "dictstore", "xyz"])
def test_a_dot_component_in_a_remote_uri_is_refused(
        kind: str, path: str, component: str, request: pytest.FixtureRequest,
        tmp_path: Path) -> None:
    base = make_storage_uri(request, kind, tmp_path)
    head, question, query = base.partition("?")
    uri = f"{head}/{path}{question}{query}"
    with pytest.raises(ConfigError, match=rf"^location='.*/{path}.*' " + DOTS.format(
            component.replace(".", r"\."))):
        resolve(uri)


def test_a_dot_component_in_a_path_on_a_remote_filesystem_is_refused(
        s3_endpoint: str) -> None:
    s3 = pafs.S3FileSystem(endpoint_override=s3_endpoint, scheme="http", region="us-east-1")
    with pytest.raises(ConfigError, match=r"^location='cairn-test/team/\.\./runs' " + DOTS
                       .format(r"\.\.")):
        resolve(f"{S3_BUCKET}/team/../runs", s3)


def test_a_fit_on_a_remote_filesystem_with_a_dot_component_writes_nothing(
        s3_endpoint: str) -> None:
    def make_s3() -> pafs.S3FileSystem:
        return pafs.S3FileSystem(endpoint_override=s3_endpoint, scheme="http",
                                 region="us-east-1")

    prefix = f"{S3_BUCKET}/dots-{os.getpid()}"
    trainer = Trainer(lambda: cairn.report({"x": 1}), scaling_config=ScalingConfig(
        num_workers=0), run_config=RunConfig(name="exp", storage_path=f"{prefix}/team/../runs",
                                             storage_filesystem=make_s3))
    with pytest.raises(ConfigError, match=DOTS.format(r"\.\.")):
        trainer.fit()
    listed = make_s3().get_file_info(pafs.FileSelector(prefix, recursive=True,
                                                       allow_not_found=True))
    assert listed == []


def test_a_dot_component_on_a_local_disk_is_resolved(tmp_path: Path) -> None:
    (tmp_path / "team").mkdir()
    assert resolve(f"{tmp_path}/team/../runs").path == f"{tmp_path}/runs"
    assert resolve(f"file://{tmp_path}/team/./runs").path == f"{tmp_path}/team/runs"
    sub = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    assert resolve("team/../runs", sub).path == "team/../runs"
