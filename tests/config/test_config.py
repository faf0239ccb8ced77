from __future__ import annotations

import pytest

from cairn import (
    CheckpointConfig,
    CheckpointUploadMode,
    ConfigError,
    FailureConfig,
    RetryPolicy,
    RunConfig,
    ScalingConfig,
)


def test_num_workers_zero_is_local_mode() -> None:
    assert ScalingConfig(num_workers=0).local_mode
    assert not ScalingConfig(num_workers=1).local_mode


def test_num_workers_negative() -> None:
    # Cairn's words (the argument, the value and what is accepted), then Ray's.
    with pytest.raises(ConfigError, match=r"^ScalingConfig.num_workers=-1 must be an integer "
                       r">= 1, 0 \(local mode.*\(Ray Train: Invalid ScalingConfig\(num_workers="
                       r"-1\): Number of workers cannot be negative\.\)$"):
        ScalingConfig(num_workers=-1)


def test_num_workers_zero_in_an_elastic_range() -> None:
    with pytest.raises(ConfigError, match=r"ScalingConfig.num_workers=\(0, 2\): min_workers=0 "
                       r"must be >= 1; num_workers must be an integer >= 1, 0 \(local mode"):
        ScalingConfig(num_workers=(0, 2))


def test_num_workers_zero_on_the_ray_backend() -> None:
    with pytest.raises(ConfigError, match=r"ScalingConfig\(num_workers=0, backend='ray'\): "
                       r"num_workers=0 is local mode, which runs the train function in this "
                       r"process"):
        ScalingConfig(num_workers=0, backend="ray")


def test_num_to_keep_zero() -> None:
    with pytest.raises(ConfigError, match=r"CheckpointConfig.num_to_keep=0 must be an integer"):
        CheckpointConfig(num_to_keep=0)


def test_score_order() -> None:
    with pytest.raises(ConfigError,
                       match=r"checkpoint_score_order='up' is not one of 'max', 'min'"):
        CheckpointConfig(checkpoint_score_order="up")  # type: ignore[arg-type]


def test_upload_mode_unknown() -> None:
    with pytest.raises(ConfigError, match=r"'fast' is not one of 'SYNC', 'ASYNC', 'NO_UPLOAD'"):
        CheckpointUploadMode.parse("fast")
    assert CheckpointUploadMode.parse("async") is CheckpointUploadMode.ASYNC


def test_max_failures() -> None:
    with pytest.raises(ConfigError,
                       match=r"FailureConfig.max_failures=-2 must be an integer >= 0 or -1"):
        FailureConfig(max_failures=-2)
    FailureConfig(max_failures=-1)


def test_run_name_must_be_one_component() -> None:
    with pytest.raises(ConfigError, match=r"RunConfig.name='a/b' must be a single path component"):
        RunConfig(name="a/b")


def test_backend_unknown() -> None:
    with pytest.raises(ConfigError,
                       match=r"ScalingConfig.backend='k8s' is not one of 'local', 'ray'"):
        ScalingConfig(backend="k8s")


def test_retry_policy() -> None:
    with pytest.raises(ConfigError, match=r"RetryPolicy.max_attempts=0 must be an integer >= 1"):
        RetryPolicy(max_attempts=0)
    policy = RetryPolicy(initial_backoff_s=1.0, max_backoff_s=3.0, jitter=False)
    assert [policy.backoff(n) for n in range(3)] == [1.0, 2.0, 3.0]


def test_accelerator_type_as_in_ray_train() -> None:
    scaling = ScalingConfig(num_workers=2, use_gpu=True, accelerator_type="A100")
    assert scaling.accelerator_type == "A100"
    assert scaling._resources_per_worker_not_none == {"GPU": 1, "accelerator_type:A100": 0.001}
    assert scaling.total_resources == {"GPU": 2, "accelerator_type:A100": 0.002}
    assert scaling.additional_resources_per_worker == {"accelerator_type:A100": 0.001}
    # As in Ray Train, CPU workers may ask for nodes with an accelerator type too.
    cpu = ScalingConfig(num_workers=2, accelerator_type="A100")
    assert cpu.total_resources == {"CPU": 2, "accelerator_type:A100": 0.002}
    assert ScalingConfig().total_resources == {"CPU": 1}
    assert ScalingConfig(use_gpu=True).total_resources == {"GPU": 1}


@pytest.mark.parametrize("value", ["", 100, True])
def test_accelerator_type_must_be_a_string(value: object) -> None:
    with pytest.raises(ConfigError, match=rf"ScalingConfig.accelerator_type={value!r} must be a "
                       r"non-empty string \(for example 'A100'\) or None"):
        ScalingConfig(accelerator_type=value)  # type: ignore[arg-type]


def test_gpu_resources_need_use_gpu() -> None:
    assert ScalingConfig(num_workers=2, use_gpu=True,
                         resources_per_worker={"CPU": 1}).total_resources == {"CPU": 2, "GPU": 2}
    with pytest.raises(ConfigError, match=r"`use_gpu` is False but `GPU` was found in "
                       r"`resources_per_worker`"):
        ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={"GPU": 1})
    with pytest.raises(ConfigError, match=r"`use_gpu` is True but `GPU` is set to 0"):
        ScalingConfig(use_gpu=True, resources_per_worker={"GPU": 0})
    for bad in (-1, float("inf"), float("nan")):
        with pytest.raises(ConfigError, match=r"ScalingConfig.resources_per_worker=\{'CPU': "
                           rf"{bad!r}\}} must be a dict of resource names to finite numbers "
                           r">= 0"):
            ScalingConfig(resources_per_worker={"CPU": bad})


def test_run_config_takes_none_for_defaults_as_ray_does() -> None:
    config = RunConfig(checkpoint_config=None, failure_config=None,  # type: ignore[arg-type]
                       callbacks=None)  # type: ignore[arg-type]
    assert config.checkpoint_config == CheckpointConfig()
    assert config.failure_config == FailureConfig()
    assert tuple(config.callbacks) == ()


def test_callbacks_without_any_hook_are_refused() -> None:
    class TuneCallback:
        def on_trial_result(self) -> None: ...

    with pytest.raises(ConfigError, match=r"RunConfig.callbacks contains .*TuneCallback.*, which "
                       r"has none of the callback hooks \(on_report, .*after_report, "
                       r"after_exception\)"):
        RunConfig(callbacks=[TuneCallback()])
    import cairn

    RunConfig(callbacks=[cairn.Callback(), cairn.UserCallback()])


def test_worker_runtime_env_env_vars_join_worker_env() -> None:
    config = RunConfig(worker_runtime_env={"env_vars": {"A": "1"}}, worker_env={"B": "2"})
    assert config.worker_env == {"A": "1", "B": "2"}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"worker_runtime_env": {"pip": ["numpy"], "env_vars": {}}},
         r"RunConfig.worker_runtime_env has \['pip'\]; Cairn supports only 'env_vars' there"),
        ({"worker_runtime_env": "env"},
         r"RunConfig.worker_runtime_env='env' must be a dict such as \{'env_vars'"),
        ({"worker_runtime_env": {"env_vars": {"A": 1}}},
         r"RunConfig.worker_runtime_env\['env_vars'\]=\{'A': 1\} must be a dict of str to str"),
        ({"worker_runtime_env": {"env_vars": {"A": "1"}}, "worker_env": {"A": "2"}},
         r"RunConfig.worker_env\['A'\]='2' and worker_runtime_env\['env_vars'\]\['A'\]='1' "
         r"disagree"),
    ],
)
def test_worker_runtime_env_refusals(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        RunConfig(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(("env", "message"), [
    ({"OMP_NUM_THREADS": 4}, "RunConfig.worker_env['OMP_NUM_THREADS']=4 must be a str "
                             "(environment variables are strings: '4')."),
    ({"A": 1}, "RunConfig.worker_env['A']=1 must be a str (environment variables are "
               "strings: '1')."),
    ({"A": True}, "RunConfig.worker_env['A']=True must be a str (environment variables are "
                  "strings)."),
    ([("A", "1")], "RunConfig.worker_env=[('A', '1')] must be a dict of variable names to str "
                   "values, such as {'OMP_NUM_THREADS': '4'}, or None."),
    ({1: "x"}, "RunConfig.worker_env[1]='x': a variable's name must be a non-empty str (not "
               "int) without '=' or NUL characters (the environment holds NAME=value "
               "entries), such as 'OMP_NUM_THREADS'."),
    ({"A=B": "x"}, "RunConfig.worker_env['A=B']='x': a variable's name must be a non-empty str "
                   "without '=' or NUL characters"),
    ({"": "x"}, "RunConfig.worker_env['']='x': a variable's name must be a non-empty str"),
    ({"A\0": "x"}, "RunConfig.worker_env['A\\x00']='x': a variable's name must be"),
    ({"A": "x\0"}, "RunConfig.worker_env['A']='x\\x00' must be a str without NUL characters"),
    ({"A": "\ud800"}, "RunConfig.worker_env['A']='\\ud800' must be a str without NUL "
                       "characters (or lone surrogates) that the environment can hold."),
])
def test_worker_env_holds_what_a_process_environment_can(env: object, message: str) -> None:
    """Refused where the config is built, naming the variable, not by subprocess.Popen in
    fit() ("expected str, bytes or os.PathLike object, not int") after an attempt counted."""
    with pytest.raises(ConfigError) as refused:
        RunConfig(worker_env=env)  # type: ignore[arg-type]
    assert str(refused.value).startswith(message), str(refused.value)
    # The same rules for Ray Train's name of it.
    with pytest.raises(ConfigError, match=r"^RunConfig.worker_runtime_env\['env_vars'\]"):
        RunConfig(worker_runtime_env={"env_vars": env})


def test_worker_env_of_str_to_str_is_taken() -> None:
    from types import MappingProxyType

    env = {"OMP_NUM_THREADS": "4", "EMPTY": "", "PATHS": "a=b:c", "NAME": "\u00e9t\u00e9"}
    assert RunConfig(worker_env=env).worker_env == env
    assert RunConfig(worker_env=None).worker_env is None
    taken = RunConfig(worker_env=MappingProxyType(env)).worker_env  # type: ignore[arg-type]
    assert type(taken) is dict and taken == env
    assert RunConfig(worker_env=env, worker_runtime_env={"env_vars": {"B": "2"}}
                     ).worker_env == {"B": "2", **env}


@pytest.mark.parametrize(("make", "cairn_words", "ray_words"), [
    (lambda: ScalingConfig(num_workers=2.0),
     "ScalingConfig.num_workers=2.0 must be an integer >= 1",
     "ScalingConfig(num_workers) must be an int or a tuple of two ints."),
    (lambda: ScalingConfig(num_workers=-1), "ScalingConfig.num_workers=-1 must be an integer >= 1",
     "Invalid ScalingConfig(num_workers=-1): Number of workers cannot be negative."),
    (lambda: ScalingConfig(num_workers=(-1, 2)), "ScalingConfig.num_workers=(-1, 2) must be",
     "Invalid ScalingConfig(num_workers=(-1, 2)): Number of workers cannot be negative."),
    (lambda: ScalingConfig(num_workers=(4, 2)),
     "ScalingConfig.num_workers=(4, 2): min_workers=4 is greater than max_workers=2",
     "Invalid ScalingConfig(num_workers=(4, 2)): min_workers=4 must be <= max_workers=2."),
    (lambda: CheckpointConfig(num_to_keep=0),
     "CheckpointConfig.num_to_keep=0 must be an integer >= 1, or None to keep every checkpoint",
     "Received invalid num_to_keep: 0."),
    (lambda: CheckpointConfig(checkpoint_score_order="up"),
     "CheckpointConfig.checkpoint_score_order='up' is not one of 'max', 'min'",
     "Received invalid checkpoint_score_order: up."),
])
def test_config_errors_say_it_in_cairns_words_then_ray_trains(
    make: object, cairn_words: str, ray_words: str
) -> None:
    """Cairn's message names the argument, the value and what is accepted; Ray Train's
    phrase for the same mistake follows, so a ported test's pytest.raises(match=...)
    finds it."""
    import re

    with pytest.raises(ValueError, match=re.escape(ray_words)) as caught:
        make()  # type: ignore[operator]
    assert isinstance(caught.value, ConfigError)
    assert str(caught.value).startswith(cairn_words)
    assert str(caught.value).endswith(f" (Ray Train: {ray_words})")
