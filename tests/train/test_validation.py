"""report(validation=...) with a ValidationConfig: real workers, a real driver kill -9."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from typing import Any

import pytest
import v2_workloads
from driver_process import finish, start_script, wait_for

import cairn
from cairn import CheckpointConfig, ScalingConfig, Trainer, TrainingFailedError
from cairn._src.run.segment_log import read_log
from cairn._src.storage.location import resolve
from cairn._src.storage.retry import RetryPolicy

RunConfigFactory = Callable[..., cairn.RunConfig]
HERE = os.path.dirname(os.path.abspath(__file__))


def listed(scratch: str, name: str) -> list[dict[str, Any]]:
    with open(os.path.join(scratch, name)) as f:
        value: list[dict[str, Any]] = json.load(f)
    return value


def events(run: str, kind: str) -> list[dict[str, Any]]:
    return [e for e in read_log(resolve(run).join("events"), RetryPolicy())
            if e.get("type") == kind]


def test_validation_merges_metrics_reranks_retention_and_protects_pending(
    run_config: RunConfigFactory, scratch: str
) -> None:
    gate = os.path.join(scratch, "gate")
    config = run_config(checkpoint_config=CheckpointConfig(
        num_to_keep=1, checkpoint_score_attribute="val_score"))
    validation = cairn.ValidationConfig(
        v2_workloads.read_score,
        cairn.ValidationTaskConfig(fn_kwargs={"offset": 100, "gate": gate, "gated_score": 9}))
    result = Trainer(
        v2_workloads.validating,
        train_loop_config={"epochs": 3, "scores": [9, 1, 5], "scratch": scratch,
                           "fn_kwargs": {"offset": 1000}, "open_gate": gate,
                           "list_validated": True},
        scaling_config=ScalingConfig(num_workers=2), run_config=config,
        validation_config=validation,
    ).fit()
    # While the validation of report 1 was held, reports 2 and 3 committed with
    # num_to_keep=1: the pending one was kept all along.
    committed = listed(scratch, "committed_1_2.json")
    pending = {i["name"]: i["status"] for i in committed}
    assert pending["checkpoint_000001"] == "PENDING_VALIDATION"
    # The validated listing waited for every validation; report()'s fn_kwargs override.
    final = listed(scratch, "validated_0.json")
    assert {i["name"]: (i["status"], i["metrics"]["val_score"]) for i in final} == {
        "checkpoint_000001": ("VALIDATED", 1009), "checkpoint_000003": ("VALIDATED", 1005)}
    # Retention re-ranked with the validation metrics: the best (1009) and the latest.
    assert [os.path.basename(c.path) for c, _ in result.best_checkpoints] == [
        "checkpoint_000003", "checkpoint_000001"]
    best = dict((os.path.basename(c.path), m) for c, m in result.best_checkpoints)
    assert best["checkpoint_000001"] == {"epoch": 0, "val_score": 1009,
                                         "validated_by": "read_score"}
    # The manifest has the merged metrics too (a rebuilt index keeps them).
    run = os.path.join(os.fspath(config.storage_path), "run")
    with open(os.path.join(run, "checkpoint_000001", "_cairn_manifest.json")) as f:
        assert json.load(f)["metrics"]["val_score"] == 1009
    assert not os.path.exists(os.path.join(run, "checkpoint_000002"))
    assert [e["dir_name"] for e in events(run, "validation_finished")] == [
        "checkpoint_000001", "checkpoint_000002", "checkpoint_000003"]
    # Result.metrics, as Ray Train gives them: the last report's metrics with the
    # validation metrics of its checkpoint, from fit() and read back.
    assert result.metrics is not None and result.metrics["val_score"] == 1005
    assert result.metrics == best["checkpoint_000003"]
    assert cairn.Result.from_path(run).metrics == result.metrics


def test_pending_validation_survives_a_driver_kill_and_completes_on_rerun(
    tmp_path: str, scratch: str
) -> None:
    storage = os.path.join(str(tmp_path), "storage")
    gate = os.path.join(scratch, "gate")
    script = os.path.join(HERE, "validation_driver.py")
    driver = start_script(script, storage, "run", scratch, gate)
    # The validation of report 2 started (and is held): kill the driver with it pending.
    wait_for(lambda: os.path.exists(gate + ".started"), driver)
    run = os.path.join(storage, "run")
    wait_for(lambda: os.path.exists(os.path.join(run, "checkpoint_000002",
                                                 "_cairn_manifest.json")), driver)
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    assert [e["dir_name"] for e in events(run, "validation_finished")] == ["checkpoint_000001"]
    open(gate, "w").close()
    summary = finish(start_script(script, storage, "run", scratch, gate))
    best = {name: metrics for name, metrics in summary["best"]}  # type: ignore[union-attr]
    assert best["checkpoint_000002"]["val_score"] == 4
    assert best["checkpoint_000001"]["val_score"] == 3
    assert sorted(e["dir_name"] for e in events(run, "validation_finished")) == [
        "checkpoint_000001", "checkpoint_000002"]


@pytest.mark.parametrize(
    ("workload", "message"),
    [(v2_workloads.validation_without_config,
      r"report\(validation=True\): `validation_config` was not set on the trainer, but a "
      r"validation was requested. Pass Trainer\(\.\.\., validation_config="
      r"cairn.ValidationConfig\(fn\)\)"),
     (v2_workloads.validation_without_checkpoint,
      r"report\(validation=True\) was given without a checkpoint. Validation requires a "
      r"checkpoint to be provided.")],
)
def test_validation_refused_with_a_clear_error(
    workload: Callable[..., None], message: str, run_config: RunConfigFactory
) -> None:
    with pytest.raises(TrainingFailedError, match=r"ReportError: " + message):
        Trainer(workload, run_config=run_config()).fit()


def test_trainer_refuses_a_validation_config_of_the_wrong_type() -> None:
    with pytest.raises(cairn.ConfigError, match=r"validation_config=\{\} must be a "
                                                r"cairn.ValidationConfig or None"):
        Trainer(v2_workloads.validating, validation_config={})  # type: ignore[arg-type]
