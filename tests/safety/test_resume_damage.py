"""Damage found at resume falls back, and `cairn verify` reports it, without hanging:
real runs through ``cairn.Trainer`` with real worker processes (issue 10, items 6 and 9).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import safety_workloads
from guards import bounded, release_fifos

import cairn
from cairn import Checkpoint, ScalingConfig, Trainer, TrainingFailedError
from cairn._src.checkpoint.manifest import MANIFEST_NAME
from cairn._src.cli.main import main as cli_main
from cairn._src.errors import NotARegularFileError

RunConfigFactory = Callable[..., cairn.RunConfig]


@pytest.fixture
def fifos() -> Iterator[list[str]]:
    """FIFOs a test makes (append their paths); released on teardown."""
    made: list[str] = []
    yield made
    release_fifos(made)


def run_dir(config: cairn.RunConfig) -> Path:
    assert config.storage_path is not None and config.name is not None
    return Path(os.fspath(config.storage_path)) / config.name


def fit(config: cairn.RunConfig, scratch: str, steps: int, **extra: object) -> cairn.Result:
    trainer = Trainer(safety_workloads.steps_with_checkpoints,
                      train_loop_config={"steps": steps, "scratch": scratch, **extra},
                      scaling_config=ScalingConfig(num_workers=2), run_config=config)
    return bounded(trainer.fit)


def damage(path: Path, how: str, fifos: list[str]) -> None:
    if how == "manifest_file_and_dir":
        manifest_path = path.parent / MANIFEST_NAME
        document = json.loads(manifest_path.read_text())
        entry = document["files"][path.name]
        document["files"][f"{path.name}/inner"] = entry
        manifest_path.write_text(json.dumps(document))
        return
    path.unlink()
    if how == "fifo":
        os.mkfifo(path)
        fifos.append(str(path))
    elif how == "dev_zero":
        path.symlink_to("/dev/zero")
    elif how == "directory":
        path.mkdir()
    elif how == "sparse_longer":
        with open(path, "wb") as f:
            f.truncate(1 << 40)


@pytest.mark.parametrize("how", ["fifo", "dev_zero", "directory", "sparse_longer",
                                 "manifest_file_and_dir"])
def test_damage_in_the_latest_checkpoint_falls_back_and_is_reported(
    how: str, run_config: RunConfigFactory, scratch: str, fifos: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = run_config()
    fit(config, scratch, steps=3)
    damage(run_dir(config) / "checkpoint_000003" / "state", how, fifos)
    capsys.readouterr()
    assert bounded(lambda: cli_main(["verify", str(run_dir(config))])) == 1
    out = capsys.readouterr().out
    assert "ok      checkpoint_000002" in out
    assert "FAILED  checkpoint_000003" in out and "2 verified, 1 failed" in out
    # The next fit() resumes from the previous committed checkpoint (step 1 -> start 2).
    result = fit(config, scratch, steps=4, check_restore=True)
    assert Path(scratch, "resumed_at").read_text().split() == ["0", "2"]
    assert result.metrics == {"step": 3}
    assert result.checkpoint is not None and result.checkpoint.path.endswith("checkpoint_000005")


def test_a_link_out_of_a_reference_is_refused_and_nothing_is_committed(
    run_config: RunConfigFactory, scratch: str, tmp_path: Path
) -> None:
    secret = tmp_path / "passwd"
    secret.write_text("root:x:0:0:root:/root:/bin/sh\n")
    target = tmp_path / "reference"
    target.mkdir()
    (target / "state").write_text('{"step": 0}')
    (target / "passwd").symlink_to(secret)
    config = run_config()
    trainer = Trainer(safety_workloads.report_reference,
                      train_loop_config={"target": str(target)},
                      scaling_config=ScalingConfig(num_workers=2), run_config=config)
    with pytest.raises(TrainingFailedError,
                       match=r"/passwd' is a symbolic link\. A checkpoint registered by "
                             r"reference .* copy the data into the directory instead of linking "
                             r"to it"):
        bounded(trainer.fit)
    index = json.loads((run_dir(config) / "cairn_run.json").read_text())
    assert index["checkpoints"] == []


def test_a_reference_damaged_after_commit_is_refused_on_restore(
    run_config: RunConfigFactory, scratch: str, tmp_path: Path
) -> None:
    target = tmp_path / "reference"
    target.mkdir()
    (target / "state").write_text('{"step": 0}')
    config = run_config()
    trainer = Trainer(safety_workloads.report_reference,
                      train_loop_config={"target": str(target)},
                      scaling_config=ScalingConfig(num_workers=2), run_config=config)
    result = bounded(trainer.fit)
    assert result.checkpoint is not None
    secret = tmp_path / "secret"
    secret.write_text('{"step": 0}')  # The same bytes: only the link gives it away.
    (target / "state").unlink()
    (target / "state").symlink_to(secret)
    with pytest.raises(NotARegularFileError, match=r"file 'state' is a symbolic link"):
        bounded(lambda: result.checkpoint.to_directory(str(tmp_path / "out")))  # type: ignore[union-attr]
    assert not (tmp_path / "out" / "state").exists()


def test_a_long_file_name_commits_and_restores(
    run_config: RunConfigFactory, scratch: str, tmp_path: Path
) -> None:
    name = "w" * 240
    config = run_config()
    result = fit(config, scratch, steps=1, files={name: "weights {step}"})
    assert result.checkpoint is not None
    out = bounded(lambda: result.checkpoint.to_directory(str(tmp_path / "out")))  # type: ignore[union-attr]
    assert Path(out, name).read_text() == "weights 0"
    restored = Checkpoint.from_directory(out)
    with restored.as_directory() as directory:
        assert sorted(os.listdir(directory)) == ["state", name]
