"""The ownership policy: what a run may delete, from what it recorded (pure, no storage)."""

from __future__ import annotations

from cairn._src.checkpoint.index import CheckpointRecord
from cairn._src.checkpoint.manifest import Manifest
from cairn._src.checkpoint.ownership import (
    REFERENCE_EVENT,
    could_have_created,
    may_delete_partial,
    plan_deletion,
    reference_event,
    registered_references,
)


def manifest(report_index: int | None = 3, **extra: object) -> Manifest:
    return Manifest(files={}, report_index=report_index, **extra)  # type: ignore[arg-type]


def test_a_managed_checkpoint_with_its_manifest_is_deleted() -> None:
    record = CheckpointRecord(dir_name="checkpoint_000003", report_index=3)
    plan = plan_deletion(record, manifest=manifest(), registered={}, delete_references=False)
    assert plan.checkpoint_dir and not plan.reference and plan.refusals == ()


def test_a_directory_without_a_manifest_is_never_deleted() -> None:
    record = CheckpointRecord(dir_name="checkpoint_000003", report_index=3)
    plan = plan_deletion(record, manifest=None, registered={}, delete_references=True)
    assert not plan.checkpoint_dir and not plan.reference
    assert "holds no Cairn manifest" in plan.refusals[0]


def test_a_manifest_of_another_report_is_not_this_record() -> None:
    record = CheckpointRecord(dir_name="checkpoint_000003", report_index=3)
    plan = plan_deletion(record, manifest=manifest(7), registered={}, delete_references=False)
    assert not plan.checkpoint_dir
    assert plan.refusals == ("the manifest in checkpoint_000003 is of report 7, the index "
                             "says report 3",)


def test_names_cairn_never_creates_are_refused() -> None:
    for name in ("metrics", "events", "cairn_run.json", "_cairn_x", ".hidden", "a b"):
        record = CheckpointRecord(dir_name=name, report_index=3)
        plan = plan_deletion(record, manifest=manifest(), registered={}, delete_references=True)
        assert not plan.checkpoint_dir, name
        assert "not a checkpoint directory name Cairn creates" in plan.refusals[0]
    assert could_have_created("checkpoint_000003") and could_have_created("best-epoch=3")


def test_a_reference_stays_unless_asked_for() -> None:
    record = CheckpointRecord(dir_name="ref", report_index=3, target_uri="/data/ref",
                              managed=True)
    registered = {"ref": ("uri", "/data/ref")}
    plan = plan_deletion(record, manifest=manifest(target_uri="/data/ref"),
                         registered=registered, delete_references=False)
    # The record's `managed: true` does not make the user's data Cairn's.
    assert plan.checkpoint_dir and not plan.reference and plan.refusals == ()


def test_a_reference_is_deleted_when_asked_for_and_registered_by_the_run() -> None:
    record = CheckpointRecord(dir_name="ref", report_index=3, target_path="/data/ref",
                              managed=False)
    plan = plan_deletion(record, manifest=manifest(target_path="/data/ref"),
                         registered={"ref": ("path", "/data/ref")}, delete_references=True)
    assert plan.checkpoint_dir and plan.reference


def test_an_unregistered_or_mismatched_reference_is_left_alone() -> None:
    record = CheckpointRecord(dir_name="ref", report_index=3, target_uri="/home/me/data")
    plan = plan_deletion(record, manifest=manifest(target_uri="/home/me/data"),
                         registered={}, delete_references=True)
    assert not plan.reference
    assert plan.refusals == ("the reference /home/me/data of ref was not registered by this "
                             "run",)
    plan = plan_deletion(record, manifest=manifest(target_uri="/elsewhere"),
                         registered={"ref": ("uri", "/home/me/data")}, delete_references=True)
    assert not plan.reference
    assert plan.refusals == ("the manifest in ref does not name the reference /home/me/data",)
    # Registered as a path, recorded as a URI: not the same reference.
    plan = plan_deletion(record, manifest=manifest(target_uri="/home/me/data"),
                         registered={"ref": ("path", "/home/me/data")}, delete_references=True)
    assert not plan.reference


def test_registered_references_come_from_the_event_log() -> None:
    record = CheckpointRecord(dir_name="ref", report_index=3, target_uri="s3://b/x")
    events = [{"type": "commit", "dir_name": "other"}, reference_event(record, t=1.0),
              {"type": REFERENCE_EVENT, "dir_name": 5}, {"type": REFERENCE_EVENT}]
    assert registered_references(events) == {"ref": ("uri", "s3://b/x")}


def test_a_partial_directory_is_deleted_only_when_cairn_created_it() -> None:
    def may(name: str, **changes: object) -> bool:
        options: dict[str, object] = {"has_manifest": False, "indexed": (), "announced": (),
                                      "holding_references": ()}
        options.update(changes)
        return may_delete_partial(name, **options)  # type: ignore[arg-type]

    assert may("checkpoint_000004")
    assert not may("checkpoint_000004", has_manifest=True)
    assert not may("checkpoint_000004", indexed={"checkpoint_000004"})
    assert not may("checkpoint_000004", holding_references={"checkpoint_000004"})
    assert not may("user_logs")
    assert may("user_logs", announced={"user_logs"})
    assert not may("metrics", announced={"metrics"})
