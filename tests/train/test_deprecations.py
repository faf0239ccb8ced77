"""Arguments and methods Ray Train v2 removed raise what Ray raises: a DeprecationWarning
(as an exception) whose message says what to do instead."""

from __future__ import annotations

import pickle
from collections.abc import Callable

import pytest

import cairn
import cairn.torch
from cairn import (
    CheckpointConfig,
    ConfigDeprecationError,
    FailureConfig,
    Result,
    RunConfig,
    ScalingConfig,
    Trainer,
)
from cairn._src.storage.location import resolve
from cairn._src.worker.context import RunStorage, TrainContext

ISSUE = r"https://github.com/ray-project/ray/issues/49454"


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: FailureConfig(fail_fast=True),
         r"`FailureConfig\(fail_fast\)` is deprecated since it is only relevant in the context "
         r"of multiple trials running in Ray Tune\. Remove it: FailureConfig\(max_failures=0\)"),
        (lambda: FailureConfig(fail_fast="raise"), r"`FailureConfig\(fail_fast\)` is deprecated"),
        (lambda: RunConfig(verbose=0),
         r"`RunConfig\(verbose\)` is deprecated\. .*RunConfig\(progress=0\|1\|2\)"),
        (lambda: RunConfig(log_to_file=True),
         r"`RunConfig\(log_to_file\)` is deprecated\. .*RunConfig\(log_to_driver=True\)"),
        (lambda: RunConfig(stop={"training_iteration": 3}),
         r"`RunConfig\(stop\)` is deprecated\. .*return from it when your condition holds"),
        (lambda: RunConfig(sync_config=object()),
         r"`RunConfig\(sync_config\)` is deprecated\. .*report\(checkpoint_upload_mode=\.\.\.\)"),
        (lambda: RunConfig(progress_reporter=object()),
         r"`RunConfig\(progress_reporter\)` is deprecated\. .*RunConfig\(callbacks=\[\.\.\.\]\)"),
        (lambda: ScalingConfig(trainer_resources={"CPU": 1}),
         r"`ScalingConfig\(trainer_resources\)` is deprecated\. .*Use `resources_per_worker`"),
        (lambda: CheckpointConfig(checkpoint_frequency=2),
         r"`checkpoint_frequency` is deprecated since it does not apply to user-defined "
         r"training functions\. Please remove this argument from your CheckpointConfig"),
        (lambda: CheckpointConfig(checkpoint_at_end=True),
         r"`checkpoint_at_end` is deprecated since it does not apply"),
        (lambda: Trainer.restore("/tmp/run"),
         r"The `restore` and `can_restore` APIs are deprecated\. To continue a run, build the "
         r"Trainer again with the same RunConfig\(name=\.\.\., storage_path=\.\.\.\)"),
        (lambda: Trainer.can_restore("/tmp/run"),
         r"The `restore` and `can_restore` APIs are deprecated"),
        (lambda: cairn.torch.TorchTrainer.restore("/tmp/run", train_loop_per_worker=print),
         r"The `restore` and `can_restore` APIs are deprecated"),
        (lambda: Trainer(print, resume_from_checkpoint=cairn.Checkpoint("/tmp/ckpt")),
         r"`resume_from_checkpoint` is deprecated\. Pass the checkpoint to the train function "
         r"through train_loop_config"),
        (lambda: cairn.torch.TorchTrainer(print, metadata={"a": 1}),
         r"`get_metadata` was an experimental API that accessed the metadata passed to "
         r"`Trainer\(metadata=\.\.\.\)`"),
    ],
)
def test_removed_arguments_raise_deprecation_warning(
    build: Callable[[], object], match: str
) -> None:
    with pytest.raises(DeprecationWarning, match=match) as info:
        build()
    assert isinstance(info.value, ConfigDeprecationError)
    assert isinstance(info.value, cairn.CairnError)
    assert ISSUE in str(info.value)
    again = pickle.loads(pickle.dumps(info.value))
    assert type(again) is ConfigDeprecationError and str(again) == str(info.value)


def test_defaults_raise_nothing_and_stay_out_of_repr() -> None:
    for config in (FailureConfig(), RunConfig(), ScalingConfig(), CheckpointConfig()):
        assert "DEPRECATED" not in repr(config)
    # A removed argument is not part of equality either.
    assert RunConfig(name="a") == RunConfig(name="a")


def _context(tmp_path: str) -> TrainContext:
    return TrainContext(world_rank=0, world_size=1, local_rank=0, local_world_size=1,
                        node_rank=0, experiment_name="run", attempt=0,
                        storage=RunStorage(resolve(tmp_path).join("run")))


@pytest.mark.parametrize("method", ["get_trial_name", "get_trial_id", "get_trial_resources",
                                    "get_trial_dir"])
def test_ray_tune_context_methods_are_refused(method: str, tmp_path: str) -> None:
    with pytest.raises(DeprecationWarning,
                       match=rf"`{method}` is deprecated because the concept of a Ray Tune "
                       r"`Trial` does not apply to training runs\. Use get_experiment_name\(\)"):
        getattr(_context(str(tmp_path)), method)()


def test_get_metadata_is_refused(tmp_path: str) -> None:
    with pytest.raises(DeprecationWarning,
                       match=r"`get_metadata` was an experimental API .*via `train_loop_config`"):
        _context(str(tmp_path)).get_metadata()


def test_result_config_is_refused_as_in_ray_train_v2() -> None:
    result = Result(metrics={"config": {"lr": 1}}, checkpoint=None, error=None, path="/x")
    with pytest.raises(DeprecationWarning,
                       match=r"The `config` property for a `Result` is deprecated, since it is "
                       r"only relevant in the context of Ray Tune"):
        _ = result.config
