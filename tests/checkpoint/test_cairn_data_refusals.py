"""A reference may not contain Cairn's own data, and a checkpoint directory may not contain
the run's storage: refused at ``report()``, with real runs, and nothing is deleted."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

import cairn
from cairn import Checkpoint, CheckpointUploadMode
from cairn._src.checkpoint.references import check_reference, check_upload_source
from cairn._src.errors import ReportError
from cairn._src.storage.location import resolve
from cairn._src.storage.retry import RetryPolicy


def _report_target(config: dict[str, Any]) -> None:
    """Two good checkpoints, then the report under test (``target``, ``mode``)."""
    context = cairn.get_context()
    for step in range(2):
        directory = os.path.join(config["scratch"], f"ok_{context.get_world_rank()}_{step}")
        os.makedirs(directory)
        with open(os.path.join(directory, "w.bin"), "wb") as f:
            f.write(b"w")
        cairn.report({"step": step}, Checkpoint.from_directory(directory))
    target = config["target"].replace("{run}", context.get_storage().run.path)
    kwargs = dict(config.get("kwargs", {}))
    if "mode" in config:
        kwargs["checkpoint_upload_mode"] = CheckpointUploadMode(config["mode"])
    handle = cairn.report({"step": 2}, Checkpoint(target), **kwargs)
    handle.wait()


def _fit(storage: str, config: dict[str, Any], **checkpoint: Any) -> cairn.Result:
    return cairn.Trainer(
        _report_target, train_loop_config=config,
        run_config=cairn.RunConfig(name="run", storage_path=storage,
                                   checkpoint_config=cairn.CheckpointConfig(**checkpoint)),
    ).fit()


def _tree(root: Path) -> dict[str, bytes]:
    out = {}
    for directory, _, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            if "lease" not in name:  # the lease is released at the end of fit()
                with open(path, "rb") as f:
                    out[os.path.relpath(path, root)] = f.read()
    return out


def _two_checkpoints(config: dict[str, Any]) -> None:
    for step in range(2):
        directory = os.path.join(config["scratch"], f"other_{step}")
        os.makedirs(directory)
        with open(os.path.join(directory, "model.bin"), "wb") as f:
            f.write(b"another run's data %d" % step)
        cairn.report({"step": step}, Checkpoint.from_directory(directory))


def _other_run(storage: Path, scratch: str) -> None:
    cairn.Trainer(_two_checkpoints, train_loop_config={"scratch": scratch},
                  run_config=cairn.RunConfig(name="other", storage_path=str(storage))).fit()


def test_the_storage_root_is_refused_and_every_other_run_stays(
    tmp_path: Path, scratch: str
) -> None:
    storage = tmp_path / "storage"
    _other_run(storage, scratch)
    (storage / "notes.txt").parent.mkdir(parents=True, exist_ok=True)
    (storage / "notes.txt").write_text("the user's file")
    before = _tree(storage)
    with pytest.raises(cairn.TrainingFailedError,
                       match=re.escape(f"{storage} is an ancestor of the run directory "
                                       f"{storage}/run (the storage root holds this and other "
                                       "runs)")):
        _fit(str(storage), {"scratch": scratch, "target": str(storage), "mode": "NO_UPLOAD"},
             num_to_keep=1, delete_unmanaged_checkpoints=True)
    after = _tree(storage)
    for name, data in before.items():
        assert after[name] == data
    result = cairn.Result.from_path(str(storage / "run"))
    assert [c.path.rsplit("/", 1)[1] for c, _ in result.best_checkpoints] == ["checkpoint_000002"]


def test_the_run_metrics_directory_is_refused_and_the_history_stays(
    tmp_path: Path, scratch: str
) -> None:
    storage = tmp_path / "storage"
    with pytest.raises(cairn.TrainingFailedError,
                       match=r"lies in the run's metrics/ directory, where Cairn keeps the "
                             r"run's metrics history"):
        _fit(str(storage), {"scratch": scratch, "target": "{run}/metrics", "mode": "NO_UPLOAD"})
    frame = cairn.Result.from_path(str(storage / "run")).metrics_dataframe
    assert frame["step"].tolist()[:2] == [0, 1]
    assert os.listdir(storage / "run" / "metrics")


def _report_under_a_cairn_name(config: dict[str, Any]) -> None:
    """Writes the checkpoint into ``<run>/checkpoint_000009`` and registers it there."""
    target = os.path.join(cairn.get_context().get_storage().run.path, "checkpoint_000009")
    os.makedirs(target)
    with open(os.path.join(target, "model.bin"), "wb") as f:
        f.write(b"the user's weights")
    cairn.report({"step": 0}, Checkpoint(target),
                 checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD)


def test_a_reference_under_a_name_cairn_gives_its_uploads_is_refused(tmp_path: Path) -> None:
    storage = tmp_path / "storage"
    with pytest.raises(cairn.TrainingFailedError,
                       match=r"NO_UPLOAD\): .*/run/checkpoint_000009 is 'checkpoint_000009', a "
                             r"name Cairn gives the directories of the checkpoints it uploads"):
        cairn.Trainer(_report_under_a_cairn_name,
                      run_config=cairn.RunConfig(name="run", storage_path=str(storage))).fit()
    # Refused before anything was registered: the user's files are where they wrote them.
    assert (storage / "run" / "checkpoint_000009" / "model.bin").read_bytes() == (
        b"the user's weights")


@pytest.mark.parametrize(
    ("mode", "kwargs"),
    [("SYNC", {"delete_local_checkpoint_after_upload": True}), ("ASYNC", {})],
)
def test_a_checkpoint_holding_the_storage_is_refused_and_nothing_is_deleted(
    tmp_path: Path, scratch: str, mode: str, kwargs: dict[str, Any]
) -> None:
    storage = tmp_path / "storage"
    storage.mkdir()
    (storage / "mine.txt").write_text("the user's file under the storage path")
    with pytest.raises(cairn.TrainingFailedError,
                       match=re.escape("Ray Train's experiment directory is contained "
                                       "within the checkpoint path: ") + ".*" + re.escape(
                                           f" passes '{storage}', which contains the run "
                                           f"directory '{storage}/run'.")):
        _fit(str(storage), {"scratch": scratch, "target": str(storage), "mode": mode,
                            "kwargs": kwargs})
    assert (storage / "mine.txt").read_text() == "the user's file under the storage path"
    result = cairn.Result.from_path(str(storage / "run"))
    assert len(result.best_checkpoints) == 2
    for checkpoint, _ in result.best_checkpoints:
        checkpoint.verify()
    # Nothing of the run was uploaded into a checkpoint of itself.
    assert sorted(n for n in os.listdir(storage / "run") if n.startswith("checkpoint")) == [
        "checkpoint_000001", "checkpoint_000002"]


# --- the checks themselves, on every kind of Cairn data ---------------------------------------


def _committed_run(root: Path) -> Any:
    run = root / "storage" / "run"
    for name in ("metrics", "events", "checkpoint_000001/sub", "mine/nested/deep",
                 "checkpoint_000007/sub"):
        (run / name).mkdir(parents=True)
    (run / "checkpoint_000001" / "_cairn_manifest.json").write_text("{}")
    (run / "mine" / "nested" / "deep" / "_cairn_manifest.json").write_text("{}")
    (run / "fresh").mkdir()
    return resolve(str(run))


@pytest.mark.parametrize(
    ("target", "why"),
    [
        ("", r"is the run directory .*/storage/run\."),
        ("..", r"is an ancestor of the run directory"),
        ("../..", r"is an ancestor of the run directory"),
        ("metrics", r"lies in the run's metrics/ directory"),
        ("events", r"lies in the run's events/ directory, where Cairn keeps the run's event "
                   r"log"),
        ("checkpoint_000001", r"is the directory of checkpoint 'checkpoint_000001', which "
                              r"Cairn committed and may delete"),
        ("checkpoint_000001/sub", r"lies inside the directory of checkpoint "
                                  r"'checkpoint_000001'"),
        ("mine", r"holds Cairn's checkpoint manifest 'nested/deep/_cairn_manifest.json'"),
        # No manifest yet, but named as Cairn names its uploads: a later report would upload
        # into it, and a sweep of uncommitted uploads would delete it once forgotten.
        ("checkpoint_000007", r"is 'checkpoint_000007', a name Cairn gives the directories "
                              r"of the checkpoints it uploads \(and deletes when one never "
                              r"commits\)"),
        ("checkpoint_000007/sub", r"lies inside 'checkpoint_000007', a name Cairn gives"),
    ],
)
def test_references_holding_cairn_data_are_refused(tmp_path: Path, target: str, why: str) -> None:
    run = _committed_run(tmp_path)
    location = resolve(os.path.normpath(os.path.join(run.path, target)))
    with pytest.raises(ReportError, match=r"report\(x\): .*" + why + r".*may not contain "
                                          r"Cairn's data"):
        check_reference(location, run, RetryPolicy(), what="report(x)")


def test_a_symlink_to_the_run_is_the_run(tmp_path: Path) -> None:
    run = _committed_run(tmp_path)
    os.symlink(run.path, tmp_path / "link")
    with pytest.raises(ReportError, match=r"is the run directory"):
        check_reference(resolve(str(tmp_path / "link")), run, RetryPolicy(), what="r")


def test_references_of_the_users_own_data_pass(tmp_path: Path) -> None:
    run = _committed_run(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    for target in (str(tmp_path / "elsewhere"), f"{run.path}/fresh"):
        assert check_reference(resolve(target), run, RetryPolicy(), what="r") == resolve(target)


def test_upload_sources_holding_the_run_are_refused(tmp_path: Path) -> None:
    run = _committed_run(tmp_path)
    for source in (run.path, str(tmp_path / "storage"), str(tmp_path)):
        with pytest.raises(ReportError, match=r"^Ray Train's experiment directory is "
                                              r"contained within the checkpoint path: r "
                                              r"passes .*, which contains the run directory"):
            check_upload_source(resolve(source), run, what="r")
    check_upload_source(resolve(str(tmp_path / "elsewhere")), run, what="r")
    check_upload_source(resolve(f"{run.path}/fresh"), run, what="r")
    # Remote storage cannot be inside a local directory.
    check_upload_source(resolve("/"), resolve("memory://bucket/run"), what="r")
    # On any store: a checkpoint on the run's store that holds the run is refused too.
    remote_run = resolve("memory://bucket/storage/run")
    for source in ("memory://bucket/storage/run", "memory://bucket/storage", "memory://bucket"):
        with pytest.raises(ReportError, match=r"^Ray Train's experiment directory is "
                                              r"contained within the checkpoint path: r "
                                              r"passes memory://bucket"):
            check_upload_source(resolve(source), remote_run, what="r")
    check_upload_source(resolve("memory://bucket/storage/other"), remote_run, what="r")
    check_upload_source(resolve("memory://elsewhere/storage"), remote_run, what="r")


def _report_on_foreign_filesystem(config: dict[str, Any]) -> None:
    import fsspec
    import pyarrow.fs as pafs

    os.makedirs(os.path.join(config["root"], "ckpt"), exist_ok=True)
    with open(os.path.join(config["root"], "ckpt", "m.bin"), "wb") as f:
        f.write(b"m")
    foreign = pafs.PyFileSystem(pafs.FSSpecHandler(fsspec.filesystem(
        "dir", path=config["root"], fs=fsspec.filesystem("file"))))
    cairn.report({}, Checkpoint("ckpt", filesystem=foreign),
                 checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD).wait()


def test_a_reference_on_a_foreign_filesystem_object_is_refused(tmp_path: Path) -> None:
    (tmp_path / "foreign").mkdir()
    with pytest.raises(cairn.TrainingFailedError) as info:
        cairn.Trainer(_report_on_foreign_filesystem,
                      train_loop_config={"root": str(tmp_path / "foreign")},
                      run_config=cairn.RunConfig(name="r", storage_path=str(tmp_path / "s"))
                      ).fit()
    message = str(info.value)
    assert ("is on a filesystem object that is not the run's storage and has no URI, so Cairn "
            "could not reach it again after a driver restart. Use the run's own storage "
            "filesystem (Checkpoint(path, filesystem=cairn.get_context().get_storage()"
            ".storage_filesystem)), or a URI under a scheme registered with "
            "cairn.storage.register_scheme().") in message
    assert "zero-argument factory" not in message


def test_a_storage_root_is_refused_by_its_path_before_its_tree_is_walked(
    tmp_path: Path,
) -> None:
    # The run's own retention may be deleting a checkpoint under the root while report()
    # checks it: the refusal must not depend on walking that tree. A FIFO elsewhere under
    # the root stands for whatever the walk would meet first.
    storage = tmp_path / "storage"
    (storage / "run").mkdir(parents=True)
    (storage / "other").mkdir()
    os.mkfifo(storage / "other" / "pipe")
    with pytest.raises(ReportError, match=re.escape(
            f"is an ancestor of the run directory {storage}/run (the storage root holds this "
            "and other runs)")):
        check_reference(resolve(str(storage)), resolve(str(storage / "run")), RetryPolicy(),
                        what="report(checkpoint=..., checkpoint_upload_mode=NO_UPLOAD)")
