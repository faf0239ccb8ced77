"""A store that lies transiently never costs a committed checkpoint (issue 26, item 1).

The store (``lying_store.py``) is a custom store over a local directory, a conformance
backend, that answers "not found" for objects it holds and leaves them out of listings,
as a client that turns a timeout into "nothing" or an eventually consistent store does.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import fault_workloads
import lying_store
import pytest
from invariants import check_run

import cairn
from cairn import CheckpointConfig, ScalingConfig, Trainer
from cairn._src.checkpoint.index import CheckpointRecord, RunIndex
from cairn._src.checkpoint.manager import CheckpointManager
from cairn._src.checkpoint.manifest import MANIFEST_NAME, Manifest, write_manifest
from cairn._src.checkpoint.recheck import recheck_uncommitted
from cairn._src.run.segment_log import SegmentLog, read_log
from cairn._src.storage.location import StorageLocation, resolve
from cairn._src.storage.retry import RetryPolicy
from cairn._src.storage.transfer import compute_entries

RETRY = RetryPolicy(max_attempts=3, initial_backoff_s=0.0, max_backoff_s=0.0)
MANIFEST_3 = f"checkpoint_000003/{MANIFEST_NAME}"


@pytest.fixture(autouse=True)
def _lying() -> None:
    lying_store.register()


@pytest.fixture
def root(tmp_path: Path) -> str:
    return str(tmp_path / "storage")


@pytest.fixture
def control(tmp_path: Path) -> str:
    return str(tmp_path / "control")


def fit(storage: str, scratch: str, steps: int, max_failures: int = 0,
        upload_failure_policy: str = "fail") -> cairn.Result:
    config = cairn.RunConfig(name="run", storage_path=storage,
                             storage_retry=RetryPolicy(max_attempts=3, initial_backoff_s=0.01),
                             failure_config=cairn.FailureConfig(max_failures=max_failures),
                             checkpoint_config=cairn.CheckpointConfig(
                                 upload_failure_policy=upload_failure_policy))
    Trainer(fault_workloads.resumable,
            train_loop_config={"steps": steps, "scratch": scratch, "run_dir": "",
                               "first_index": 1},
            scaling_config=ScalingConfig(num_workers=2), run_config=config).fit()
    return cairn.Result.from_path(resolve(storage).join("run").uri or "")


def forget_commit_of_report_3(run_dir: str) -> None:
    """Leave the run as a driver killed after the manifest of report 3 and before the
    index write leaves it: the index and the event log do not know of that commit."""
    index_path = os.path.join(run_dir, "cairn_run.json")
    with open(index_path) as f:
        index = json.load(f)
    index["checkpoints"] = [r for r in index["checkpoints"] if r["report_index"] != 3]
    index["next_report_index"] = 3
    with open(index_path, "w") as f:
        json.dump(index, f)
    events = os.path.join(run_dir, "events")
    for name in os.listdir(events):
        path = os.path.join(events, name)
        with open(path) as f:
            lines = [line for line in f if not ('"commit"' in line and '"index": 3,' in line)]
        with open(path, "w") as f:
            f.writelines(lines)


def test_three_not_found_answers_do_not_delete_a_committed_checkpoint(
        root: str, control: str, scratch: str) -> None:
    storage = lying_store.lying_uri(root, control)
    fit(storage, scratch, steps=3)
    run_dir = os.path.join(root, "store", "run")
    forget_commit_of_report_3(run_dir)
    # At the restart the store answers "not found" for that manifest three times.
    lying_store.add_rule(control, "not_found", MANIFEST_3, times=3)
    result = fit(storage, scratch, steps=5)
    assert lying_store.lies_told(control) == {"not_found": 3}
    assert os.path.exists(os.path.join(run_dir, MANIFEST_3))
    names = sorted(c.path.rsplit("/", 1)[-1] for c, _ in result.best_checkpoints)
    assert names == [f"checkpoint_{i:06d}" for i in range(1, 6)]
    # The run resumed from report 3 (step 2), not one checkpoint earlier.
    second = max(int(n.split("_")[1]) for n in os.listdir(scratch) if n.startswith("resumed_"))
    with open(os.path.join(scratch, f"resumed_{second}_0")) as f:
        assert json.load(f) == 3
    check_run(run_dir, scratch)


# --- the checkpoint manager at start-up, over the lying store --------------------------


def committed_on_disk(root: str, name: str, report_index: int) -> None:
    """A committed checkpoint ``name`` of the run under ``root``, written truthfully."""
    directory = os.path.join(root, "store", "run", name)
    os.makedirs(directory)
    with open(os.path.join(directory, "weights.bin"), "wb") as f:
        f.write(b"w" * 10)
    entries = compute_entries(resolve(directory), ["weights.bin"])
    write_manifest(resolve(directory), Manifest(files=entries, report_index=report_index),
                   RETRY)


def manager_at(run: StorageLocation, next_report_index: int = 3) -> CheckpointManager:
    return CheckpointManager(run, CheckpointConfig(), RETRY,
                             RunIndex(next_report_index=next_report_index),
                             SegmentLog(run.join("metrics"), RETRY))


def lying_run(root: str, control: str) -> StorageLocation:
    return resolve(lying_store.lying_uri(root, control)).join("run")


def test_reconcile_adopts_a_manifest_found_when_read_again(root: str, control: str) -> None:
    committed_on_disk(root, "checkpoint_000003", 3)
    lying_store.add_rule(control, "not_found", MANIFEST_3, times=3)
    manager = manager_at(lying_run(root, control))
    manager.reconcile()
    assert [r.dir_name for r in manager.index.checkpoints] == ["checkpoint_000003"]
    assert os.path.exists(os.path.join(root, "store", "run", MANIFEST_3))


def test_a_manifest_listed_but_never_read_is_left_in_place(
        root: str, control: str, caplog: pytest.LogCaptureFixture) -> None:
    committed_on_disk(root, "checkpoint_000003", 3)
    lying_store.add_rule(control, "not_found", MANIFEST_3)
    manager = manager_at(lying_run(root, control))
    with caplog.at_level(logging.WARNING):
        manager.reconcile()
    assert manager.index.checkpoints == ()
    assert os.path.exists(os.path.join(root, "store", "run", MANIFEST_3))
    assert ("Leaving checkpoint_000003 in place: storage answers that it has no manifest, "
            "but a fresh listing shows its manifest") in caplog.text


def test_a_commit_in_the_event_log_keeps_a_directory_storage_denies(
        root: str, control: str, caplog: pytest.LogCaptureFixture) -> None:
    committed_on_disk(root, "checkpoint_000003", 3)
    run = lying_run(root, control)
    events = SegmentLog(run.join("events"), RETRY)
    events.append({"type": "commit", "index": 3, "t": 1.0})
    events.flush()
    # Reads and listings both deny the manifest: only the event log knows.
    lying_store.add_rule(control, "not_found", MANIFEST_3)
    lying_store.add_rule(control, "unlisted", MANIFEST_3)
    manager = manager_at(run)
    with caplog.at_level(logging.WARNING):
        manager.reconcile()
        manager.delete_uncommitted(["checkpoint_000003"])
    assert os.path.exists(os.path.join(root, "store", "run", MANIFEST_3))
    assert "the run's event log records its commit" in caplog.text


def test_delete_uncommitted_asks_again_before_deleting(root: str, control: str) -> None:
    committed_on_disk(root, "checkpoint_000003", 3)
    lying_store.add_rule(control, "not_found", MANIFEST_3, times=2)
    manager = manager_at(lying_run(root, control))
    manager.delete_uncommitted(["checkpoint_000003"])
    assert os.path.exists(os.path.join(root, "store", "run", MANIFEST_3))


def test_a_directory_that_never_committed_is_still_deleted(root: str, control: str) -> None:
    partial = os.path.join(root, "store", "run", "checkpoint_000003")
    os.makedirs(partial)
    with open(os.path.join(partial, "rank_0.json"), "w") as f:
        f.write("{}")
    manager = manager_at(lying_run(root, control))
    manager.reconcile()
    # Its objects are gone (the store keeps the empty folders a local directory has).
    assert [files for _, _, files in os.walk(partial) if files] == []


# --- a store that acknowledges writes and keeps nothing (item 5) ------------------------


def test_a_dropped_write_fails_the_commit_naming_the_store(
        root: str, control: str, scratch: str) -> None:
    storage = lying_store.lying_uri(root, control)
    lying_store.add_rule(control, "drop", "checkpoint_000002/rank_1.json")
    with pytest.raises(cairn.TrainingFailedError,
                       match=r"Commit of checkpoint checkpoint_000002 failed: The store at "
                             r"lying://.*acknowledged every write of this checkpoint, but a "
                             r"listing of it now shows: 'rank_1.json' is missing\. It was not "
                             r"committed\."):
        fit(storage, scratch, steps=3)
    assert lying_store.lies_told(control) == {"drop": 1}
    run_dir = os.path.join(root, "store", "run")
    assert not os.path.exists(os.path.join(run_dir, "checkpoint_000002", MANIFEST_NAME))
    result = cairn.Result.from_path(resolve(storage).join("run").uri or "")
    assert result.checkpoint is not None and result.checkpoint.path.endswith("000001")


def test_a_dropped_write_under_the_skip_policy_skips_that_checkpoint_and_trains_on(
        root: str, control: str, scratch: str, caplog: pytest.LogCaptureFixture) -> None:
    storage = lying_store.lying_uri(root, control)
    lying_store.add_rule(control, "drop", "checkpoint_000002/rank_1.json")
    with caplog.at_level(logging.WARNING):
        result = fit(storage, scratch, steps=3, upload_failure_policy="skip")
    assert "Skipping the checkpoint of report 2: The store at lying://" in caplog.text
    assert result.metrics == {"step": 2, "loss": 1 / 3}
    names = [c.path.rsplit("/", 1)[-1] for c, _ in result.best_checkpoints]
    assert names == ["checkpoint_000001", "checkpoint_000003"]
    # The skipped directory never committed and its files are gone (the store keeps
    # objects in files under a local directory, whose empty folders may stay).
    skipped = os.path.join(root, "store", "run", "checkpoint_000002")
    assert not os.path.exists(skipped) or not os.listdir(skipped)


# --- a soak: several restarts over a store that lies now and then -----------------------


def test_soak_with_a_transiently_lying_store_loses_no_committed_checkpoint(
        root: str, control: str, scratch: str) -> None:
    # Every manifest and listing of a checkpoint may be denied, at most twice in a row per
    # object; each fit() is a driver restart, whose start-up reconciles the run. A restore
    # that meets a lie fails its attempt (no data is lost), and the next attempt retries.
    storage = lying_store.lying_uri(root, control)
    lying_store.add_rule(control, "not_found", MANIFEST_NAME, ratio=0.3, per_key=2)
    lying_store.add_rule(control, "unlisted", MANIFEST_NAME, ratio=0.3, per_key=2)
    run_dir = os.path.join(root, "store", "run")
    committed: set[str] = set()
    for steps in (2, 4, 6):
        result = fit(storage, scratch, steps=steps, max_failures=20)
        names = {c.path.rsplit("/", 1)[-1] for c, _ in result.best_checkpoints}
        assert committed <= names, f"lost {sorted(committed - names)}"
        committed = names
        assert all(os.path.exists(os.path.join(run_dir, name, MANIFEST_NAME))
                   for name in committed)
    assert result.metrics == {"step": 5, "loss": 1 / 6}
    assert sum(lying_store.lies_told(control).values()) > 0
    # Every SYNC report that returned is still committed, and every checkpoint verifies.
    # (A directory storage denied may be left in place: a leftover, never a loss.)
    # Read back without lies: through the store's own directory.
    for checkpoint, _ in cairn.Result.from_path(run_dir).best_checkpoints:
        checkpoint.verify()
    for name in os.listdir(scratch):
        if name.startswith("sync_returned_"):
            with open(os.path.join(scratch, name)) as f:
                assert f"checkpoint_{json.load(f):06d}" in committed


def test_a_checkpoint_whose_deletion_retention_logged_is_deleted_when_half_gone(
        root: str, control: str) -> None:
    # Committed, then dropped by retention: the log has its commit and then its deletion.
    # A driver killed mid-deletion left it without its manifest; the next start deletes it.
    partial = os.path.join(root, "store", "run", "checkpoint_000001")
    os.makedirs(partial)
    with open(os.path.join(partial, "rank_0.json"), "w") as f:
        f.write("{}")
    run = lying_run(root, control)
    events = SegmentLog(run.join("events"), RETRY)
    events.append({"type": "commit", "index": 1, "t": 1.0})
    events.append({"type": "checkpoint_deleting", "dir_name": "checkpoint_000001",
                   "report_index": 1, "reason": "retention", "t": 2.0})
    events.flush()
    manager_at(run).reconcile()
    assert not os.path.exists(os.path.join(partial, "rank_0.json"))


def test_a_resume_over_thousands_of_index_records_without_directories_reads_no_backoff(
        root: str, control: str) -> None:
    # Neither listed nor committed in the log: one more read each, no sleep per record.
    run = lying_run(root, control)
    slept: list[float] = []
    names = {f"bogus_{i}" for i in range(2000)}
    for name in sorted(names):
        recheck = recheck_uncommitted(run.join(name), name, RETRY, set, listed=set,
                                      sleep=slept.append)
        assert recheck.never_committed
    assert slept == []


def manager_over(run: StorageLocation, *names: str, verify: str = "sizes") -> CheckpointManager:
    """A manager whose index holds the committed checkpoints ``names`` (reports 1, 2...)."""
    records = tuple(CheckpointRecord(dir_name=n, report_index=i, managed=True)
                    for i, n in enumerate(names, start=1))
    return CheckpointManager(run, CheckpointConfig(verify_on_resume=verify), RETRY,
                             RunIndex(checkpoints=records, next_report_index=len(names) + 1),
                             SegmentLog(run.join("metrics"), RETRY))


@pytest.mark.parametrize("lie", ["unlisted", "not_found"])
@pytest.mark.parametrize("verify", ["sizes", "full"])
def test_a_file_left_out_once_does_not_drop_the_latest_checkpoint_at_resume(
        root: str, control: str, lie: str, verify: str) -> None:
    committed_on_disk(root, "checkpoint_000001", 1)
    committed_on_disk(root, "checkpoint_000002", 2)
    lying_store.add_rule(control, lie, "checkpoint_000002/weights.bin", times=1)
    manager = manager_over(lying_run(root, control), "checkpoint_000001",
                           "checkpoint_000002", verify=verify)
    chosen = manager.choose_resume()
    assert chosen is not None and chosen.dir_name == "checkpoint_000002"
    assert [r.dir_name for r in manager.index.checkpoints] == [
        "checkpoint_000001", "checkpoint_000002"]


@pytest.mark.parametrize("verify", ["sizes", "full"])
def test_a_file_every_listing_lacks_still_drops_its_checkpoint(
        root: str, control: str, verify: str) -> None:
    committed_on_disk(root, "checkpoint_000001", 1)
    committed_on_disk(root, "checkpoint_000002", 2)
    os.remove(os.path.join(root, "store", "run", "checkpoint_000002", "weights.bin"))
    manager = manager_over(lying_run(root, control), "checkpoint_000001",
                           "checkpoint_000002", verify=verify)
    chosen = manager.choose_resume()
    assert chosen is not None and chosen.dir_name == "checkpoint_000001"
    assert [r.dir_name for r in manager.index.checkpoints] == ["checkpoint_000001"]


# --- an index write whose answer is lost --------------------------------------------------


def _fit_losing_index_answers(storage: str, control: str) -> cairn.Result:
    """Two validated reports of one rank; the store keeps the first commit's index write
    but answers each of its three tries with an error (one attempt fails)."""
    config = cairn.RunConfig(name="run", storage_path=storage,
                             storage_retry=RetryPolicy(max_attempts=3, initial_backoff_s=0.01),
                             failure_config=cairn.FailureConfig(max_failures=1))
    return Trainer(fault_workloads.index_answer_lost,
                   train_loop_config={"steps": 2, "control": control, "lost": 3},
                   scaling_config=ScalingConfig(num_workers=1), run_config=config,
                   validation_config=cairn.ValidationConfig(fault_workloads.step_score),
                   ).fit()


def test_a_commit_whose_index_write_answer_was_lost_is_adopted_and_validated(
        root: str, control: str, scratch: str) -> None:
    # Every try of the first commit's index write is kept by the store but answered with
    # an error: the attempt fails, the next one adopts the checkpoint (its manifest
    # landed) and resumes from it, and its validation runs in this same fit().
    storage = lying_store.lying_uri(root, control)
    result = _fit_losing_index_answers(storage, control)
    assert lying_store.lies_told(control) == {"lost_answer": 3}
    run = resolve(storage).join("run")
    finished = {e["dir_name"]: e["status"] for e in read_log(run.join("events"), RETRY)
                if e.get("type") == "validation_finished"}
    assert finished == {"checkpoint_000001": "VALIDATED", "checkpoint_000002": "VALIDATED"}
    validated = {os.path.basename(c.path): m.get("val_step")
                 for c, m in result.best_checkpoints}
    assert validated == {"checkpoint_000001": 0, "checkpoint_000002": 1}


def test_a_lost_index_answer_and_one_lie_about_its_manifest_still_resume_from_it(
        root: str, control: str, scratch: str) -> None:
    # The index write of checkpoint_000001 landed and its answer was lost (three times):
    # the attempt fails and the next one settles the commit. The store then answers "not
    # found" for its manifest once: asked again, it is adopted, resumed from, and the
    # stored index keeps naming it (never dropped on one answer).
    storage = lying_store.lying_uri(root, control)
    lying_store.add_rule(control, "not_found", f"checkpoint_000001/{MANIFEST_NAME}", times=1)
    result = _fit_losing_index_answers(storage, control)
    assert lying_store.lies_told(control) == {"lost_answer": 3, "not_found": 1}
    run_dir = os.path.join(root, "store", "run")
    with open(os.path.join(run_dir, "cairn_run.json")) as f:
        index = json.load(f)
    assert index["resumed_from"] == "checkpoint_000001"
    assert [r["dir_name"] for r in index["checkpoints"]] == [
        "checkpoint_000001", "checkpoint_000002"]
    names = sorted(os.path.basename(c.path) for c, _ in result.best_checkpoints)
    assert names == ["checkpoint_000001", "checkpoint_000002"]


def uncertain_commit(root: str, control: str) -> tuple[CheckpointManager, StorageLocation]:
    """A manager whose commit of checkpoint_000001 wrote its manifest and its index, and
    lost every answer of the index write: the commit is uncertain."""
    from cairn._src.checkpoint.views import ReadyCheckpoint
    from cairn._src.errors import StorageError

    directory = os.path.join(root, "store", "run", "checkpoint_000001")
    os.makedirs(directory)
    with open(os.path.join(directory, "weights.bin"), "wb") as f:
        f.write(b"w" * 10)
    entries = compute_entries(resolve(directory), ["weights.bin"])
    run = lying_run(root, control)
    manager = manager_at(run, next_report_index=1)
    lying_store.add_rule(control, "lost_answer", "cairn_run.json", times=RETRY.max_attempts)
    ready = ReadyCheckpoint(index=1, dir_name="checkpoint_000001", metrics={}, entries=entries,
                            ranks=(0,), reference=None, metadata={}, bytes_uploaded=10)
    with pytest.raises(StorageError):
        manager.commit(ready, attempt=0)
    assert manager.index.find("checkpoint_000001") is None
    return manager, run


def stored_index_names(root: str) -> list[str]:
    with open(os.path.join(root, "store", "run", "cairn_run.json")) as f:
        return [r["dir_name"] for r in json.load(f)["checkpoints"]]


def test_settling_an_uncertain_commit_asks_again_when_its_manifest_reads_as_missing(
        root: str, control: str) -> None:
    manager, _ = uncertain_commit(root, control)
    assert stored_index_names(root) == ["checkpoint_000001"]  # the write landed
    lying_store.add_rule(control, "not_found", f"checkpoint_000001/{MANIFEST_NAME}", times=1)
    assert manager.settle_uncertain() == {"checkpoint_000001"}
    assert lying_store.lies_told(control)["not_found"] == 1
    chosen = manager.choose_resume()
    assert chosen is not None and chosen.dir_name == "checkpoint_000001"
    manager.save_index(resumed_from=chosen.dir_name)
    assert stored_index_names(root) == ["checkpoint_000001"]


def test_an_uncertain_commit_storage_answers_inconsistently_for_stays_uncertain(
        root: str, control: str) -> None:
    from cairn._src.errors import StorageError

    manager, _ = uncertain_commit(root, control)
    # Every read denies the manifest, a listing shows it: in doubt, the attempt fails
    # and the commit is settled at the next one, once the store answers consistently.
    lying_store.add_rule(control, "not_found", f"checkpoint_000001/{MANIFEST_NAME}",
                         times=1 + max(3, RETRY.max_attempts))
    with pytest.raises(StorageError, match="a fresh listing shows its manifest"):
        manager.settle_uncertain()
    assert manager.index.find("checkpoint_000001") is None
    assert manager.settle_uncertain() == {"checkpoint_000001"}
    assert stored_index_names(root) == ["checkpoint_000001"]


def test_an_uncertain_commit_whose_manifest_never_landed_is_forgotten(
        root: str, control: str) -> None:
    manager, _ = uncertain_commit(root, control)
    os.remove(os.path.join(root, "store", "run", "checkpoint_000001", MANIFEST_NAME))
    assert manager.settle_uncertain() == set()
    assert manager.settle_uncertain() == set()  # settled once
    assert manager.index.find("checkpoint_000001") is None
