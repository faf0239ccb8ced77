"""A run directory Ray Train wrote (a script ported mid-training keeps its RunConfig name
and storage_path): ``fit()`` refuses it before it writes anything, on every storage, and
says how to start from Ray's latest checkpoint; a Cairn run is never taken for Ray's.

The layouts are the files Ray Train 2.60 wrote for ``RunConfig(name="run")`` (Ray Train 2,
three reports with checkpoints; Ray Train 1 through Tune, two), written here without Ray.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

import cairn
from cairn import Checkpoint, ConfigError, RunConfig, ScalingConfig, Trainer
from cairn._src.run.ray_train_dir import ray_train_marker, refuse_ray_train_run
from cairn._src.storage.fileio import list_dir_names, write_bytes_atomic
from cairn._src.storage.location import StorageLocation, resolve
from cairn._src.storage.retry import RetryPolicy

RAY2_CHECKPOINTS = ("checkpoint_2026-12-08_00-11-47.399426",
                    "checkpoint_2026-12-08_00-11-47.607271",
                    "checkpoint_2026-12-08_00-11-47.812436")
TRIAL = "DataParallelTrainer_0789c_00000_0_2026-12-08_00-12-18"


def _ray2_files() -> dict[str, bytes]:
    results = [{"version": 0, "checkpoint_dir_name": name, "metrics": {"epoch": epoch}}
               for epoch, name in enumerate(RAY2_CHECKPOINTS)]
    snapshot = {"ray_version": "2.60.0", "checkpoint_results": results,
                "checkpoint_report_indices": [0, 1, 2], "latest_checkpoint_result": results[-1],
                "pending_training_results": [], "pending_validation_specs": [],
                "current_report_index": 3, "validated_checkpoint_dir_names": [],
                "timed_out_validation_checkpoint_dir_names": [],
                "failed_validation_checkpoint_dir_names": []}
    files = {".validate_storage_marker": b"",
             "checkpoint_manager_snapshot.json": json.dumps(snapshot).encode()}
    for epoch, name in enumerate(RAY2_CHECKPOINTS):
        files[f"{name}/s.json"] = json.dumps({"epoch": epoch}).encode()
    return files


def _ray1_files() -> dict[str, bytes]:
    files = {".validate_storage_marker": b"", "trainer.pkl": b"\x80\x05.",
             "tuner.pkl": b"\x80\x05.",
             "experiment_state-2026-12-08_00-12-18.json": b"{}",
             "basic-variant-state-2026-12-08_00-12-18.json": b"{}",
             f"{TRIAL}/params.json": b"{}", f"{TRIAL}/params.pkl": b"\x80\x05.",
             f"{TRIAL}/result.json": b"", f"{TRIAL}/progress.csv": b""}
    for epoch in range(2):
        files[f"{TRIAL}/checkpoint_{epoch:06d}/s.json"] = json.dumps({"epoch": epoch}).encode()
    return files


def _write(run: StorageLocation, files: dict[str, bytes]) -> None:
    for relative, data in files.items():
        write_bytes_atomic(run.join(relative), data, RetryPolicy())


def _tree(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None
            for p in sorted(root.rglob("*"))}


def _train(config: dict[str, object]) -> None:
    checkpoint = cairn.get_checkpoint()
    if checkpoint is None and config.get("resume_from"):
        checkpoint = Checkpoint(str(config["resume_from"]))
    start = 0
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            with open(os.path.join(directory, "s.json")) as file:
                start = json.load(file)["epoch"] + 1
    for epoch in range(start, int(str(config["epochs"]))):
        directory = os.path.join(str(config["scratch"]), f"epoch-{epoch}")
        os.makedirs(directory)
        with open(os.path.join(directory, "s.json"), "w") as file:
            json.dump({"epoch": epoch}, file)
        cairn.report({"epoch": epoch, "start": start},
                     checkpoint=Checkpoint.from_directory(directory),
                     checkpoint_dir_name=config.get("dir_name") if epoch == 0 else None)


def _fit(storage: Path, name: str, scratch: Path, **config: object) -> cairn.Result:
    scratch.mkdir(parents=True, exist_ok=True)
    return Trainer(_train, train_loop_config={"epochs": 5, "scratch": str(scratch), **config},
                   scaling_config=ScalingConfig(num_workers=0),
                   run_config=RunConfig(name=name, storage_path=str(storage), progress=0)).fit()


def test_the_markers_of_ray_train_runs_and_never_of_a_cairn_run() -> None:
    assert ray_train_marker(n.split("/")[0] for n in _ray2_files()) == \
        "checkpoint_manager_snapshot.json"
    assert ray_train_marker(n.split("/")[0] for n in _ray1_files()) == "tuner.pkl"
    assert ray_train_marker(["experiment_state-2026-12-08_00-12-18.json", TRIAL]) == \
        "experiment_state-2026-12-08_00-12-18.json"
    # Ray's storage check alone: a Ray run that stopped before its first checkpoint.
    assert ray_train_marker([".validate_storage_marker"]) is None
    assert ray_train_marker([]) is None
    # Any of Cairn's own entries make it Cairn's run, whatever else it holds.
    for cairn_entry in ("cairn_run.json", "lease.json", "events", "metrics",
                        "_cairn_lease.3", "_cairn_storage_check.json"):
        assert ray_train_marker(["checkpoint_manager_snapshot.json", "tuner.pkl",
                                 cairn_entry]) is None


def test_a_ray_train_run_is_refused_on_every_storage_with_nothing_written(
        storage_uri: str) -> None:
    run = resolve(storage_uri).join("run")
    _write(run, _ray2_files())
    before = list_dir_names(run, RetryPolicy())
    latest = run.join(RAY2_CHECKPOINTS[-1]).display()
    with pytest.raises(ConfigError, match=re.escape(
            f"RunConfig(name='run') with this storage_path names the run directory "
            f"{run.display()}, which holds a Ray Train run (checkpoint_manager_snapshot.json, "
            "which Ray Train writes), not a Cairn run. Cairn cannot resume Ray Train's "
            "checkpoints in place, and a new run there would start from scratch beside them; "
            "nothing was written. Give the Cairn run another RunConfig(name=...) or "
            "storage_path. To start the Cairn run from Ray Train's latest checkpoint, pass "
            f"its path ({latest}) in train_loop_config and, in the train function, load it "
            "with cairn.Checkpoint(path).as_directory() when cairn.get_checkpoint() returns "
            "None")):
        refuse_ray_train_run(run, RetryPolicy(), name="run")
    assert list_dir_names(run, RetryPolicy()) == before
    # A directory that does not exist yet is a new run.
    refuse_ray_train_run(resolve(storage_uri).join("other"), RetryPolicy(), name="other")


def test_a_snapshot_that_names_no_listed_checkpoint_is_refused_naming_none(
        tmp_path: Path) -> None:
    run = resolve(str(tmp_path / "run"))
    _write(run, {"checkpoint_manager_snapshot.json": b'{"latest_checkpoint_result": '
                                                     b'{"checkpoint_dir_name": "../x"}}'})
    with pytest.raises(ConfigError, match="from a checkpoint Ray Train wrote there") as info:
        refuse_ray_train_run(run, RetryPolicy(), name="run")
    assert "../x" not in str(info.value)


def test_fit_refuses_a_ray_train_2_run_and_its_advice_resumes_from_rays_checkpoint(
        tmp_path: Path) -> None:
    storage = tmp_path / "storage"
    _write(resolve(str(storage / "run")), _ray2_files())
    before = _tree(storage)
    with pytest.raises(ConfigError, match=re.escape(
            f"{storage / 'run'}, which holds a Ray Train run "
            "(checkpoint_manager_snapshot.json, which Ray Train writes)")) as info:
        _fit(storage, "run", tmp_path / "scratch")
    assert _tree(storage) == before  # not a lease, a claim, a log or a marker
    latest = str(storage / "run" / RAY2_CHECKPOINTS[-1])
    assert f"({latest})" in str(info.value)
    # Its advice: another name, and Ray's latest checkpoint passed in by hand.
    result = _fit(storage, "run-cairn", tmp_path / "scratch", resume_from=latest)
    assert result.metrics == {"epoch": 4, "start": 3}
    assert {k: v for k, v in _tree(storage).items() if k.split("/")[0] == "run"} == before


def test_fit_refuses_a_ray_train_1_run(tmp_path: Path) -> None:
    storage = tmp_path / "storage"
    _write(resolve(str(storage / "run")), _ray1_files())
    before = _tree(storage)
    with pytest.raises(ConfigError, match=re.escape(
            "which holds a Ray Train run (tuner.pkl, which Ray Train writes), not a Cairn "
            "run.")) as info:
        _fit(storage, "run", tmp_path / "scratch")
    assert "Ray Train 1 keeps them in the trial directory inside it" in str(info.value)
    assert _tree(storage) == before


def test_a_cairn_run_beside_ray_train_files_is_continued(tmp_path: Path) -> None:
    storage = tmp_path / "storage"
    # A checkpoint named like Ray's file, in a run that stops after its first report.
    first = _fit(storage, "run", tmp_path / "first", epochs=1, dir_name="tuner.pkl")
    assert first.checkpoint is not None and first.checkpoint.path.endswith("tuner.pkl")
    # Ray Train's files beside it (a run directory both wrote before Cairn refused Ray's).
    _write(resolve(str(storage / "run")), _ray2_files())
    result = _fit(storage, "run", tmp_path / "second")
    assert result.metrics == {"epoch": 4, "start": 1}


def test_a_state_file_name_with_a_control_character_is_not_taken_for_rays() -> None:
    # The marker is quoted in the refusal: a planted name must not send ESC to a terminal.
    assert ray_train_marker(["experiment_state-\x1b[2J.json", TRIAL]) is None
