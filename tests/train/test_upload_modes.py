"""ASYNC back-pressure, NO_UPLOAD by reference, checkpoint_upload_fn, local deletion."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
import workloads
from workloads import run_dir

import cairn
from cairn import CheckpointConfig, FailureConfig, ScalingConfig, Trainer

RunConfigFactory = Callable[..., cairn.RunConfig]


def test_async_waits_only_for_a_free_slot(run_config: RunConfigFactory) -> None:
    config = run_config(checkpoint_config=CheckpointConfig(max_pending_uploads=1))
    result = Trainer(workloads.async_backpressure, scaling_config=ScalingConfig(num_workers=2),
                     run_config=config).fit()
    assert result.checkpoint is not None
    stalls = [e for e in _events(config) if e.get("kind") == "checkpoint_stall"]
    assert len(stalls) == 8  # 4 reports x 2 ranks, each recorded for goodput


def test_fit_does_not_finish_before_pending_uploads_commit(run_config: RunConfigFactory) -> None:
    result = Trainer(workloads.async_then_return, scaling_config=ScalingConfig(num_workers=2),
                     run_config=run_config()).fit()
    assert result.checkpoint is not None
    result.checkpoint.verify()


def test_sync_keeps_the_local_copy_unless_asked(run_config: RunConfigFactory,
                                                scratch: str) -> None:
    Trainer(workloads.sync_keeps_local_copy, train_loop_config={"scratch": scratch},
            run_config=run_config()).fit()


def test_no_upload_registers_by_reference_and_resumes_from_it(
    run_config: RunConfigFactory, tmp_path: os.PathLike[str]
) -> None:
    target = os.path.join(os.fspath(tmp_path), "my_store")
    config = run_config(failure_config=FailureConfig(max_failures=1),
                        checkpoint_config=CheckpointConfig(num_to_keep=1))
    result = Trainer(
        workloads.no_upload_reference,
        train_loop_config={"steps": 4, "target": target, "crash_at": 1},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=config,
    ).fit()
    assert result.checkpoint is not None
    assert result.checkpoint.path == os.path.join(target, "step_3")
    assert result.checkpoint.get_metadata() == {"before": 3, "step": 3}
    result.checkpoint.verify()
    manifest = result.checkpoint.get_manifest()
    assert manifest is not None and set(manifest.files) == {"rank_0.bin", "rank_1.bin"}
    # Retention forgot the older references but did not delete the user's data.
    assert sorted(n for n in os.listdir(target) if n.startswith("step_")) == [
        "step_0", "step_1", "step_2", "step_3"]
    assert result.goodput.failures == 1
    steps = list(result.metrics_dataframe["step"])
    assert steps == [0, 1, 2, 3]  # crashed after 1 was committed: resumed from it


def test_no_upload_references_deleted_when_asked(
    run_config: RunConfigFactory, tmp_path: os.PathLike[str]
) -> None:
    target = os.path.join(os.fspath(tmp_path), "my_store")
    config = run_config(checkpoint_config=CheckpointConfig(
        num_to_keep=1, delete_unmanaged_checkpoints=True))
    Trainer(workloads.no_upload_reference, train_loop_config={"steps": 3, "target": target},
            scaling_config=ScalingConfig(num_workers=2), run_config=config).fit()
    assert sorted(n for n in os.listdir(target) if n.startswith("step_")) == ["step_2"]


def test_checkpoint_upload_fn_replaces_the_upload(
    run_config: RunConfigFactory, tmp_path: os.PathLike[str]
) -> None:
    target = os.path.join(os.fspath(tmp_path), "uploaded")
    result = Trainer(workloads.upload_fn_run, train_loop_config={"target": target},
                     scaling_config=ScalingConfig(num_workers=2), run_config=run_config()).fit()
    assert result.checkpoint is not None
    assert result.checkpoint.path == os.path.join(target, "checkpoint_000001")
    manifest = result.checkpoint.get_manifest()
    assert manifest is not None and set(manifest.files) == {"rank_0.bin", "rank_1.bin"}


def _events(config: cairn.RunConfig) -> list[dict[str, object]]:
    from cairn._src.run.segment_log import read_log
    from cairn._src.storage.location import resolve
    from cairn._src.storage.retry import RetryPolicy

    return read_log(resolve(os.path.join(run_dir(config), "events")), RetryPolicy())


def test_deferred_reports_write_on_the_upload_thread(run_config: RunConfigFactory) -> None:
    result = Trainer(workloads.deferred_reports, scaling_config=ScalingConfig(num_workers=2),
                     run_config=run_config()).fit()
    assert result.checkpoint is not None
    with result.checkpoint.as_directory() as d:
        assert sorted(os.listdir(d)) == ["_cairn_manifest.json", "state_0.json", "state_1.json"]
        assert open(os.path.join(d, "state_1.json")).read() == '{"step": 2, "rank": 1}'


def test_deferred_report_that_writes_other_files(run_config: RunConfigFactory) -> None:
    with pytest.raises(cairn.TrainingFailedError,
                       match=r"did not write the files it declared: missing \['declared.bin'\]"):
        Trainer(workloads.deferred_reports, train_loop_config={"lie": True},
                run_config=run_config()).fit()


def test_unpicklable_store_registration_is_refused_clearly(
    run_config: RunConfigFactory,
) -> None:
    import threading

    from cairn.storage import register_scheme, unregister_scheme

    lock = threading.Lock()
    register_scheme("lockedstore", lambda uri: lock)
    try:
        with pytest.raises(cairn.ConfigError,
                           match=r"registered for scheme 'lockedstore' cannot be pickled"):
            Trainer(workloads.counting, train_loop_config={"steps": 1},
                    run_config=run_config()).fit()
    finally:
        unregister_scheme("lockedstore")


def test_async_upload_fn_that_registers_in_place_keeps_the_data(
    run_config: RunConfigFactory, tmp_path: os.PathLike[str]
) -> None:
    target = os.path.join(os.fspath(tmp_path), "dcp")
    result = Trainer(workloads.upload_fn_in_place, train_loop_config={"target": target},
                     scaling_config=ScalingConfig(num_workers=2), run_config=run_config()).fit()
    assert result.checkpoint is not None
    assert result.checkpoint.path == os.path.join(target, "in_place")
    result.checkpoint.verify()


def test_retention_keeps_data_a_kept_checkpoint_shares(run_config: RunConfigFactory) -> None:
    config = run_config(checkpoint_config=CheckpointConfig(num_to_keep=1))
    result = Trainer(workloads.same_reference_twice, run_config=config).fit()
    assert result.checkpoint is not None
    result.checkpoint.verify()
    with result.checkpoint.as_directory() as d:
        assert open(os.path.join(d, "state.bin"), "rb").read() == b"step1"


def test_refused_no_upload_report_fails_the_run(
    run_config: RunConfigFactory, tmp_path: os.PathLike[str]
) -> None:
    with pytest.raises(cairn.TrainingFailedError,
                       match=r"NO_UPLOAD checkpoints of report 1 point to different places"):
        Trainer(workloads.no_upload_disagreeing,
                train_loop_config={"target": os.fspath(tmp_path)},
                scaling_config=ScalingConfig(num_workers=2), run_config=run_config()).fit()


def test_dir_name_over_committed_reference_data_is_refused(
    run_config: RunConfigFactory,
) -> None:
    config = run_config()
    with pytest.raises(cairn.TrainingFailedError,
                       match=r"checkpoint_dir_name='ckpt_a'\) on rank 0: this name is already "
                             r"used"):
        Trainer(workloads.name_over_reference_data, run_config=config).fit()
    data = os.path.join(run_dir(config), "ckpt_a", "w.bin")
    assert open(data, "rb").read() == b"committed"


def test_train_function_the_workers_cannot_load(
    run_config: RunConfigFactory, tmp_path: os.PathLike[str]
) -> None:
    import sys

    module = os.path.join(os.fspath(tmp_path), "only_on_the_driver.py")
    with open(module, "w") as f:
        f.write("def train():\n    pass\n")
    sys.path.insert(0, os.fspath(tmp_path))
    try:
        import only_on_the_driver
    finally:
        sys.path.remove(os.fspath(tmp_path))
    os.remove(module)  # gone before the workers start: they cannot import it
    config = run_config(failure_config=cairn.FailureConfig(max_failures=3))
    with pytest.raises(cairn.TrainingFailedError,
                       match=r"could not load the train function or its config: "
                             r"ModuleNotFoundError"):
        Trainer(only_on_the_driver.train, run_config=config).fit()
    assert cairn.Result.from_path(run_dir(config)).goodput.attempts == 1  # fatal: no retry
