"""Arguments and methods Ray Train removed in its v2 API, refused as Ray Train refuses them.

Ray Train v2 raises ``DeprecationWarning`` (as an exception, not a warning) for each of
them; so does Cairn, through ``ConfigDeprecationError``, a ``DeprecationWarning``. Each
message names what was passed, says why it is gone, and what to do instead.
"""

from __future__ import annotations

# The default of a removed argument: anything else means the caller passed it.
DEPRECATED = "DEPRECATED"

RAY_MIGRATION_ISSUE = "https://github.com/ray-project/ray/issues/49454"
_CONTEXT = f"Ray Train v2 removed it too; see {RAY_MIGRATION_ISSUE} for the migration."

FAIL_FAST = (
    "`FailureConfig(fail_fast)` is deprecated since it is only relevant in the context of "
    "multiple trials running in Ray Tune. Remove it: FailureConfig(max_failures=0), the "
    f"default, already fails the run on the first worker failure. {_CONTEXT}"
)

TRAINER_RESOURCES = (
    "`ScalingConfig(trainer_resources)` is deprecated. It reserved resources for the "
    "driver, which does no heavy computation and reserves none. Use "
    f"`resources_per_worker` for the training workers. {_CONTEXT}"
)

_RUN_CONFIG_HINTS = {
    "verbose": "Cairn's driver shows a live view of the run instead: set it with "
    "RunConfig(progress=0|1|2), and the detail of its logs with the level of the 'cairn' "
    "logger",
    "log_to_file": "the workers' stdout and stderr already reach the driver "
    "(RunConfig(log_to_driver=True), the default)",
    "stop": "stop from the train function instead: return from it when your condition holds",
    "sync_config": "Cairn uploads checkpoints itself; choose how with "
    "report(checkpoint_upload_mode=...)",
    "progress_reporter": "follow the run with RunConfig(callbacks=[...]) instead",
}
RUN_CONFIG_REMOVED = tuple(_RUN_CONFIG_HINTS)


def run_config_message(argument: str) -> str:
    return (
        f"`RunConfig({argument})` is deprecated. This configuration was a Ray Tune API that "
        f"does not apply to training runs: {_RUN_CONFIG_HINTS[argument]}. {_CONTEXT}"
    )


def checkpoint_config_message(argument: str) -> str:
    return (
        f"`{argument}` is deprecated since it does not apply to user-defined training "
        "functions. Please remove this argument from your CheckpointConfig: report() a "
        f"checkpoint whenever you want one. {_CONTEXT}"
    )


TRAINER_RESTORE = (
    "The `restore` and `can_restore` APIs are deprecated. To continue a run, build the "
    "Trainer again with the same RunConfig(name=..., storage_path=...) and call fit(): it "
    "resumes from the latest committed checkpoint; Result.from_path(run_dir) reads a run "
    f"back. {_CONTEXT}"
)

RESUME_FROM_CHECKPOINT = (
    "`resume_from_checkpoint` is deprecated. Pass the checkpoint to the train function "
    "through train_loop_config and load it when get_checkpoint() returns None, or continue "
    f"the run itself by calling fit() again with the same RunConfig. {_CONTEXT}"
)

GET_METADATA = (
    "`get_metadata` was an experimental API that accessed the metadata passed to "
    "`Trainer(metadata=...)`. Pass the metadata directly to the training function "
    f"instead (e.g. via `train_loop_config`). {_CONTEXT}"
)


def trial_method_message(method: str) -> str:
    return (
        f"`{method}` is deprecated because the concept of a Ray Tune `Trial` does not apply "
        "to training runs. Use get_experiment_name() for the run's name, and pass anything "
        f"else the train function needs through `train_loop_config`. {_CONTEXT}"
    )

