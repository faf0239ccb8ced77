"""Deletion: a run deletes only what it created, inside itself (issue 10, items 1, 8, 13).

Real runs through ``cairn.Trainer`` with real worker processes, on local storage and on a
real S3-protocol server (moto). A forged run index, as anyone who can write a shared
bucket could leave it, must not make the driver (or ``cairn prune``) delete anything the
run does not own.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import safety_workloads

import cairn
from cairn import CheckpointConfig, RunConfig, ScalingConfig, Trainer
from cairn._src.checkpoint import index as index_module
from cairn._src.checkpoint import manager as manager_module
from cairn._src.checkpoint.index import read_index, rebuild_index
from cairn._src.cli.main import main as cli_main
from cairn._src.run.layout import INDEX_NAME
from cairn._src.storage.fileio import read_bytes, write_bytes_atomic
from cairn._src.storage.location import StorageLocation, resolve
from cairn._src.storage.retry import RetryPolicy

RETRY = RetryPolicy()


def fit(config: RunConfig, scratch: str, steps: int) -> cairn.Result:
    trainer = Trainer(safety_workloads.steps_with_checkpoints,
                      train_loop_config={"steps": steps, "scratch": scratch},
                      scaling_config=ScalingConfig(num_workers=2), run_config=config)
    return trainer.fit()


def make_victim(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "precious.txt").write_text("the user's data")
    return path


def forge_index(run: StorageLocation, records: list[dict[str, Any]]) -> None:
    """Add ``records`` to the run's index, as a forger with write access would."""
    index = json.loads(read_bytes(run.join(INDEX_NAME), RETRY))
    index["checkpoints"] = records + index["checkpoints"]
    write_bytes_atomic(run.join(INDEX_NAME), json.dumps(index).encode(), RETRY)


def forged_records(victim: Path) -> list[dict[str, Any]]:
    return [
        # The data of a "managed" checkpoint somewhere outside the run.
        {"dir_name": "forged_ref", "report_index": 0, "target_uri": str(victim),
         "managed": True},
        # A "managed" checkpoint whose directory holds no manifest.
        {"dir_name": "checkpoint_000000", "report_index": 0, "managed": True},
    ]


@pytest.mark.parametrize("delete_references", [False, True])
def test_a_forged_local_index_deletes_nothing_outside_the_run(
    delete_references: bool, tmp_path: Path, scratch: str, caplog: pytest.LogCaptureFixture
) -> None:
    victim = make_victim(tmp_path / "outside" / "victim")
    config = RunConfig(name="run", storage_path=str(tmp_path / "storage"),
                       checkpoint_config=CheckpointConfig(
                           num_to_keep=1, delete_unmanaged_checkpoints=delete_references))
    fit(config, scratch, steps=2)
    run = resolve(str(tmp_path / "storage" / "run"))
    user_dir = make_victim(tmp_path / "storage" / "run" / "checkpoint_000000")
    forge_index(run, forged_records(victim))
    with caplog.at_level(logging.WARNING):
        result = fit(config, scratch, steps=4)
    assert result.metrics == {"step": 3}
    # Retention dropped the forged records from the index and deleted nothing they name.
    index = read_index(run, RETRY)
    assert index is not None
    # The checkpoint the attempt resumed from (checkpoint_000002) was kept only until the
    # attempt committed a newer one.
    assert [r.dir_name for r in index.checkpoints] == ["checkpoint_000004"]
    assert (victim / "precious.txt").read_text() == "the user's data"
    assert (user_dir / "precious.txt").read_text() == "the user's data"
    assert "checkpoint_000000 holds no Cairn manifest" in caplog.text
    assert "forged_ref holds no Cairn manifest" in caplog.text


def test_a_forged_manifest_does_not_make_a_reference_deletable(
    tmp_path: Path, scratch: str, caplog: pytest.LogCaptureFixture
) -> None:
    victim = make_victim(tmp_path / "outside" / "victim")
    config = RunConfig(name="run", storage_path=str(tmp_path / "storage"),
                       checkpoint_config=CheckpointConfig(num_to_keep=1,
                                                          delete_unmanaged_checkpoints=True))
    fit(config, scratch, steps=2)
    run_dir = tmp_path / "storage" / "run"
    # A forger also writes a manifest naming the victim as the reference's data.
    manifest = json.loads((run_dir / "checkpoint_000002" / "_cairn_manifest.json").read_text())
    manifest.update(report_index=0, target_uri=str(victim), files={})
    (run_dir / "forged_ref").mkdir()
    (run_dir / "forged_ref" / "_cairn_manifest.json").write_text(json.dumps(manifest))
    forge_index(resolve(str(run_dir)), [forged_records(victim)[0]])
    with caplog.at_level(logging.WARNING):
        fit(config, scratch, steps=4)
    assert (victim / "precious.txt").read_text() == "the user's data"
    assert f"the reference {victim} of forged_ref was not registered by this run" in caplog.text
    # The forged manifest directory was Cairn-shaped, inside the run: that goes.
    assert not (run_dir / "forged_ref").exists()


def test_a_forged_index_on_s3_deletes_no_local_directory(
    s3_uri_factory: Callable[[str], str], tmp_path: Path, scratch: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    victim = make_victim(tmp_path / "outside" / "victim")
    storage = s3_uri_factory("deletion")
    config = RunConfig(name="run", storage_path=storage,
                       checkpoint_config=CheckpointConfig(num_to_keep=1,
                                                          delete_unmanaged_checkpoints=True))
    fit(config, scratch, steps=2)
    run = resolve(storage).join("run")
    forge_index(run, forged_records(victim))
    with caplog.at_level(logging.WARNING):
        result = fit(config, scratch, steps=4)
    assert result.metrics == {"step": 3}
    assert (victim / "precious.txt").read_text() == "the user's data"
    assert "forged_ref holds no Cairn manifest" in caplog.text


def test_prune_deletes_only_what_the_run_owns(
    tmp_path: Path, scratch: str, capsys: pytest.CaptureFixture[str]
) -> None:
    victim = make_victim(tmp_path / "outside" / "victim")
    config = RunConfig(name="run", storage_path=str(tmp_path / "storage"))
    fit(config, scratch, steps=3)
    run_dir = tmp_path / "storage" / "run"
    forge_index(resolve(str(run_dir)), forged_records(victim))
    capsys.readouterr()
    code = cli_main(["prune", str(run_dir), "--keep", "1", "--delete-references"])
    out = capsys.readouterr().out
    assert code == 0
    assert (victim / "precious.txt").read_text() == "the user's data"
    assert "left in place: forged_ref" in out and "left in place: checkpoint_000000" in out
    # The run's own checkpoints were pruned.
    assert not (run_dir / "checkpoint_000001").exists()
    assert not (run_dir / "checkpoint_000002").exists()
    assert (run_dir / "checkpoint_000003").is_dir()


def test_a_checkpoint_dropped_as_damaged_stays_dropped(
    tmp_path: Path, scratch: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config = RunConfig(name="run", storage_path=str(tmp_path / "storage"))
    fit(config, scratch, steps=3)
    run_dir = tmp_path / "storage" / "run"
    (run_dir / "checkpoint_000003" / "state").write_text('{"step": 9}')  # byte-changed
    fit(config, scratch, steps=3)  # resumes from checkpoint_000002; 000003 dropped
    fit(config, scratch, steps=3)  # the next fit() does not adopt it back
    index = read_index(resolve(str(run_dir)), RETRY)
    assert index is not None
    assert "checkpoint_000003" not in [r.dir_name for r in index.checkpoints]
    events = [json.loads(line) for name in sorted(os.listdir(run_dir / "events"))
              for line in (run_dir / "events" / name).read_text().splitlines() if line]
    assert [e["dir_name"] for e in events if e["type"] == "checkpoint_dropped"] == [
        "checkpoint_000003"]
    # The damaged directory stays on storage for the user to inspect, and `cairn verify`
    # still reports it, though the index no longer names it.
    assert (run_dir / "checkpoint_000003" / "state").exists()
    capsys.readouterr()
    assert cli_main(["verify", str(run_dir)]) == 1
    out = capsys.readouterr().out
    assert "DROPPED checkpoint_000003: damaged, dropped from the index at resume" in out
    assert "verified, 0 failed, 1 dropped as damaged" in out
    # Its manifest still reads: an index rebuilt from the manifests leaves it out too.
    (run_dir / "cairn_run.json").write_text("not json")
    indexed = [r.dir_name for r in index.checkpoints]
    rebuilt = rebuild_index(resolve(str(run_dir)), RETRY)
    assert [r.dir_name for r in rebuilt.checkpoints] == indexed
    assert [c.path.rsplit("/", 1)[-1] for c, _ in
            cairn.Result.from_path(str(run_dir)).best_checkpoints] == indexed


def test_resuming_over_many_bogus_records_writes_the_index_once(
    tmp_path: Path, scratch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = RunConfig(name="run", storage_path=str(tmp_path / "storage"))
    fit(config, scratch, steps=1)
    run = resolve(str(tmp_path / "storage" / "run"))
    bogus = [{"dir_name": f"bogus_{i}", "report_index": 1000 + i} for i in range(3000)]
    forge_index(run, bogus)

    writes: list[int] = []
    original = index_module.write_index

    def counting(location: StorageLocation, index: Any, retry: RetryPolicy,
                 **options: Any) -> None:
        writes.append(len(index.checkpoints))
        original(location, index, retry, **options)

    # Every index write of the driver goes through this wrapper.
    monkeypatch.setattr(manager_module, "write_index", counting)
    result = fit(config, scratch, steps=2)
    assert result.metrics == {"step": 1}
    # One write drops all 3,000 bogus records; then the attempt's own writes.
    assert writes[0] == 1
    assert all(n <= 2 for n in writes) and len(writes) < 10


def test_prune_delete_references_deletes_the_dropped_references_data(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    refs = tmp_path / "refs"
    Trainer(safety_workloads.report_references,
            train_loop_config={"steps": 3, "refs": str(refs)},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(name="run", storage_path=str(tmp_path / "storage"))).fit()
    run_dir = tmp_path / "storage" / "run"
    capsys.readouterr()
    assert cli_main(["prune", str(run_dir), "--keep", "1", "--delete-references",
                     "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [(d["dir_name"], d["deleted"]) for d in document["dropped"]] == [
        ("checkpoint_000001", True), ("checkpoint_000002", True)]
    # The dropped references' data is gone (the user asked), the kept one's stays.
    assert sorted(p.name for p in refs.iterdir()) == ["ref2"]
    assert (refs / "ref2" / "w.bin").read_bytes() == b"weights 2"


@pytest.mark.parametrize("delete_references", [False, True])
def test_retention_keeps_upload_fn_data_inside_the_named_checkpoint_directory(
    delete_references: bool, tmp_path: Path
) -> None:
    # A checkpoint_upload_fn writes <run>/<name>/dcp and returns it: the manifest goes into
    # <run>/<name>, the parent of the user's data. Retention forgets the checkpoint and
    # deletes its manifest; the data goes only when the user asked.
    config = RunConfig(name="run", storage_path=str(tmp_path / "storage"),
                       checkpoint_config=CheckpointConfig(
                           num_to_keep=1, delete_unmanaged_checkpoints=delete_references))
    run_dir = tmp_path / "storage" / "run"
    for fit_number, steps in enumerate((3, 2)):
        result = Trainer(safety_workloads.upload_into_the_named_directory,
                         train_loop_config={"steps": steps},
                         scaling_config=ScalingConfig(num_workers=2), run_config=config).fit()
        assert result.metrics == {"step": steps - 1}
        # The second fit also settles the run directory first (reconcile) and must not
        # delete the forgotten data as a partial upload.
        index = read_index(resolve(str(run_dir)), RETRY)
        assert index is not None
        latest = 3 if fit_number == 0 else 5
        assert [r.dir_name for r in index.checkpoints] == [f"checkpoint_{latest:06d}"]
        assert (run_dir / f"checkpoint_{latest:06d}" / "_cairn_manifest.json").is_file()
        for report in range(1, latest):
            named = run_dir / f"checkpoint_{report:06d}"
            if delete_references:
                assert not named.exists()
            else:
                assert sorted(p.name for p in named.iterdir()) == ["dcp"]
                state = json.loads((named / "dcp" / "state").read_text())
                assert state == {"step": report - 1 if report <= 3 else report - 4}
