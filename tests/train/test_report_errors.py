"""Bad report() input: a clear error raised in the worker, naming argument and value."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
import workloads
from workloads import run_dir

import cairn
from cairn import CheckpointConfig, ScalingConfig, Trainer, TrainingFailedError

RunConfigFactory = Callable[..., cairn.RunConfig]


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("not_dict", r"report\(metrics=\[\('loss', 1.0\)\]\) must be a dict .* not list"),
        ("non_string_key", r"has the key 1 of type int; metric names must be strings"),
        ("unserializable", r"has the value <object object .*> for 'model' \(object\), which "
                           r"cannot be serialized"),
        ("missing_path", r"report\(checkpoint=\.\.\.\): .*/no/such/checkpoint"),
        ("unsafe_dir_name", r"report\(checkpoint_dir_name='\.\./escape'\) is not a safe "
                            r"directory name"),
        ("unknown_mode", r"checkpoint_upload_mode='fast' is not one of 'SYNC', 'ASYNC', "
                         r"'NO_UPLOAD'"),
        ("missing_score", r"report\(metrics=\.\.\.\) has no 'acc', the "
                          r"checkpoint_score_attribute"),
    ],
)
def test_bad_report_fails_the_run_with_a_clear_error(
    case: str, message: str, run_config: RunConfigFactory
) -> None:
    config = run_config(
        checkpoint_config=CheckpointConfig(checkpoint_score_attribute="acc"),
        failure_config=cairn.FailureConfig(max_failures=3),
    )
    with pytest.raises(TrainingFailedError, match=message) as info:
        Trainer(workloads.bad_report, train_loop_config={"case": case}, run_config=config).fit()
    # Bad input is fatal: no restart wastes the failure budget on it.
    assert "[rank 0] ReportError" in str(info.value) or "ConfigError" in str(info.value)
    assert cairn.Result.from_path(run_dir(config)).goodput.attempts == 1
    leftovers = [n for n in os.listdir(run_dir(config)) if n.startswith("checkpoint")]
    assert leftovers == []


def test_reused_dir_name(run_config: RunConfigFactory) -> None:
    config = run_config()
    with pytest.raises(TrainingFailedError, match=r"checkpoint_dir_name='best'.* already used"):
        Trainer(workloads.bad_report, train_loop_config={"case": "reused_dir_name"},
                run_config=config).fit()
    result = cairn.Result.from_path(run_dir(config))
    assert result.checkpoint is not None and result.checkpoint.path.endswith("/best")
    with result.checkpoint.as_directory() as d:
        assert open(os.path.join(d, "r0.bin"), "rb").read() == b"x"


def test_ranks_disagreeing_on_dir_name(run_config: RunConfigFactory) -> None:
    with pytest.raises(TrainingFailedError,
                       match=r"Ranks disagree on checkpoint_dir_name for report 1: rank \d gave "
                             r"'epoch_\d', rank \d gave 'epoch_\d'"):
        Trainer(workloads.bad_report, train_loop_config={"case": "disagreeing_dir_names"},
                scaling_config=ScalingConfig(num_workers=2), run_config=run_config()).fit()


def test_two_ranks_writing_one_path(run_config: RunConfigFactory) -> None:
    config = run_config()
    with pytest.raises(TrainingFailedError,
                       match=r"Ranks \d and \d both wrote 'model.pt' into the checkpoint of "
                             r"report 1"):
        Trainer(workloads.bad_report, train_loop_config={"case": "collision"},
                scaling_config=ScalingConfig(num_workers=2), run_config=config).fit()
    # Never a silent overwrite, never a committed checkpoint, nothing left behind.
    assert [n for n in os.listdir(run_dir(config)) if n.startswith("checkpoint")] == []


def test_report_outside_a_worker() -> None:
    with pytest.raises(cairn.ReportError, match=r"cairn.report\(\) was called outside a Cairn "
                                                r"worker"):
        cairn.report({"loss": 1.0})
    with pytest.raises(cairn.ReportError, match=r"get_checkpoint\(\) was called outside"):
        cairn.get_checkpoint()


def test_train_function_with_two_required_arguments() -> None:
    def train(a: int, b: int) -> None: ...

    with pytest.raises(cairn.ConfigError, match=r"takes 2 required arguments"):
        Trainer(train)
