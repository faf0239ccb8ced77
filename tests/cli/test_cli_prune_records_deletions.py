"""``cairn prune`` records each deletion in the run's event log (``checkpoint_deleting``)
before any of its data goes, as the driver's retention does: a prune whose deletion fails
half way (a storage outage, from ``tests/fault``'s ``faultfs://`` store) leaves a directory
without a manifest, which the next ``fit()`` of the run deletes instead of keeping it as a
committed checkpoint whose manifest went missing. Real runs, made by a tiny ``fit()``; the
prune reaches the same files through ``faultfs://``."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import cli_workloads
import pytest

import cairn
from cairn._src.checkpoint.index import read_index
from cairn._src.cli.common import RETRY
from cairn._src.cli.main import main
from cairn._src.run.events import CheckpointDeleting, read_events
from cairn._src.run.layout import EVENTS_DIR, MANIFEST_NAME
from cairn._src.storage.location import resolve
from cairn.storage import unregister_scheme

# The fault-injecting store of tests/fault, imported by name here and, through the driver's
# sys.path, in the worker processes (which receive the in-code store registrations).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fault"))
import fault_store

pytestmark = pytest.mark.slow
NAME = "run"


@pytest.fixture(autouse=True)
def _faultfs() -> Iterator[None]:
    fault_store.register()
    yield
    unregister_scheme("faultfs")


def fit(storage: Path, steps: int) -> None:
    result = cairn.Trainer(
        cli_workloads.train, train_loop_config={"steps": steps},
        run_config=cairn.RunConfig(
            name=NAME, storage_path=str(storage),
            storage_retry=cairn.RetryPolicy(max_attempts=3, initial_backoff_s=0.001,
                                            max_backoff_s=0.01))).fit()
    assert result.error is None


def faultfs_run(tmp_path: Path, outage: Path, outage_key: str) -> str:
    """The run under ``tmp_path / "storage"`` as a ``faultfs://`` URI whose operations on
    keys containing ``outage_key`` fail while the count in ``outage`` is above 0."""
    uri = fault_store.faultfs_uri(str(tmp_path), outage=str(outage), outage_key=outage_key)
    return uri.replace("faultfs://storage?", f"faultfs://storage/{NAME}?")


def tree(directory: Path) -> dict[str, tuple[int, bytes]]:
    """Every entry under ``directory``: its modification time and, for a file, its bytes."""
    return {str(p.relative_to(directory)): (p.stat().st_mtime_ns,
                                            p.read_bytes() if p.is_file() else b"")
            for p in sorted(directory.rglob("*"))}


def files(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())


def indexed(run: Path) -> list[str]:
    index = read_index(resolve(str(run)), RETRY)
    assert index is not None
    return [r.dir_name for r in index.checkpoints]


def deletions_logged(run: Path) -> list[tuple[str | None, int | None, str]]:
    return [(e.dir_name, e.report_index, e.reason)
            for e in read_events(resolve(str(run)).join(EVENTS_DIR), RETRY)
            if isinstance(e, CheckpointDeleting)]


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_prune_whose_deletion_fails_half_way_is_finished_by_the_next_fit(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    storage = tmp_path / "storage"
    run = storage / NAME
    fit(storage, steps=3)
    assert indexed(run) == ["checkpoint_000001", "checkpoint_000002", "checkpoint_000003"]
    kept = tree(run / "checkpoint_000003")
    outage = tmp_path / "outage"
    uri = faultfs_run(tmp_path, outage, outage_key="checkpoint_000002/state.txt")

    # A dry run writes nothing: no index, no event log record, no lease.
    before = tree(run)
    code, out, _ = cli(capsys, "prune", uri, "--keep", "1", "--latest", "--dry-run")
    assert code == 0 and out.endswith("2 checkpoints to drop, 1 kept\n")
    assert tree(run) == before

    # The data file of checkpoint_000002 cannot be deleted (longer than the retries last),
    # after its manifest went.
    outage.write_text("1000")
    code, out, err = cli(capsys, "prune", uri, "--keep", "1", "--latest")
    outage.write_text("0")
    assert code == 2, (out, err)
    assert "injected outage in delete" in err
    assert indexed(run) == ["checkpoint_000003"]
    assert files(run / "checkpoint_000001") == []
    assert files(run / "checkpoint_000002") == ["state.txt"]
    # Both deletions were recorded (durably: read back from storage) before any data went.
    assert deletions_logged(run) == [("checkpoint_000001", 1, "cairn prune"),
                                     ("checkpoint_000002", 2, "cairn prune")]
    assert tree(run / "checkpoint_000003") == kept

    # The next start finishes the deletion instead of keeping the directory as a committed
    # checkpoint whose manifest storage lost.
    caplog.set_level(logging.INFO, logger="cairn._src.checkpoint.reconcile")
    fit(storage, steps=1)
    assert "Deleted checkpoint_000002: a directory without a manifest" in caplog.text
    assert "Leaving checkpoint_000002 in place" not in caplog.text
    assert not (run / "checkpoint_000002").exists()
    assert not (run / "checkpoint_000001").exists()
    assert indexed(run) == ["checkpoint_000003", "checkpoint_000004"]
    assert tree(run / "checkpoint_000003") == kept
    assert (run / "checkpoint_000004" / MANIFEST_NAME).is_file()


def test_prune_deletes_nothing_while_the_event_log_cannot_record_the_deletions(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    storage = tmp_path / "storage"
    run = storage / NAME
    fit(storage, steps=2)
    index = read_index(resolve(str(run)), RETRY)
    checkpoints = {name: tree(run / name) for name in indexed(run)}
    # The segment the prune would write its records to cannot be written.
    segments = sorted(n for n in os.listdir(run / EVENTS_DIR) if n.endswith(".jsonl"))
    next_segment = f"segment_{int(segments[-1][len('segment_'):-len('.jsonl')]) + 1:06d}"
    outage = tmp_path / "outage"
    uri = faultfs_run(tmp_path, outage, outage_key=f"{EVENTS_DIR}/{next_segment}.jsonl")
    outage.write_text("1000")
    code, out, err = cli(capsys, "prune", uri, "--keep", "1", "--latest")
    outage.write_text("0")
    assert code == 2, (out, err)
    assert "could not record the deletion of 1 checkpoint" in err
    assert "the index was written back; nothing changed" in err
    assert read_index(resolve(str(run)), RETRY) == index
    assert {name: tree(run / name) for name in checkpoints} == checkpoints
    assert deletions_logged(run) == []

    # Once storage answers, the same prune records the deletion, then deletes.
    code, out, err = cli(capsys, "prune", uri, "--keep", "1", "--latest")
    assert code == 0, (out, err)
    assert deletions_logged(run) == [("checkpoint_000001", 1, "cairn prune")]
    assert indexed(run) == ["checkpoint_000002"]
    assert files(run / "checkpoint_000001") == []
    assert tree(run / "checkpoint_000002") == checkpoints["checkpoint_000002"]


def test_deletions_a_failed_prune_never_reached_are_finished_not_adopted_back(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture) -> None:
    storage = tmp_path / "storage"
    run = storage / NAME
    fit(storage, steps=4)
    kept = tree(run / "checkpoint_000004")
    outage = tmp_path / "outage"
    uri = faultfs_run(tmp_path, outage, outage_key="checkpoint_000001/state.txt")
    # The first deletion fails half way: the prune stops before the two others, whose
    # manifests stay, though the index no longer names them.
    outage.write_text("1000")
    code, out, err = cli(capsys, "prune", uri, "--keep", "1", "--latest")
    outage.write_text("0")
    assert code == 2, (out, err)
    assert indexed(run) == ["checkpoint_000004"]
    assert (run / "checkpoint_000003" / MANIFEST_NAME).is_file()
    assert [name for name, _, _ in deletions_logged(run)] == [
        "checkpoint_000001", "checkpoint_000002", "checkpoint_000003"]

    # The next start finishes all three, through the ownership check retention uses.
    caplog.set_level(logging.INFO)
    fit(storage, steps=1)
    assert "Adopting" not in caplog.text
    assert ("Finishing the deletion of 2 checkpoints that retention or cairn prune began: "
            "['checkpoint_000002', 'checkpoint_000003']") in caplog.text
    for name in ("checkpoint_000001", "checkpoint_000002", "checkpoint_000003"):
        assert not (run / name).exists(), name
    assert indexed(run) == ["checkpoint_000004", "checkpoint_000005"]
    assert tree(run / "checkpoint_000004") == kept
