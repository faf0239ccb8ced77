"""The backend a run's ScalingConfig names."""

from __future__ import annotations

from cairn._src.backends.protocol import WorkerBackend
from cairn._src.config.run import RunConfig, ScalingConfig
from cairn._src.errors import ConfigError


def make_backend(scaling: ScalingConfig, run_config: RunConfig) -> WorkerBackend:
    """The backend ``scaling.backend`` names; Ray is imported only when asked for."""
    if scaling.backend == "local":
        from cairn._src.backends.local import LocalBackend

        failure = run_config.failure_config
        return LocalBackend(forward_output=run_config.log_to_driver, env=run_config.worker_env,
                            warm_standby=failure.warm_standby and failure.max_failures != 0)
    if scaling.backend == "ray":
        try:
            from cairn._src.backends.ray import RayBackend
        except ImportError as exc:
            raise ConfigError(
                "ScalingConfig(backend='ray') needs Ray: pip install 'cairn-train[ray]' "
                f"(import failed: {exc})."
            ) from exc
        failure = run_config.failure_config
        return RayBackend(scaling, env=run_config.worker_env,
                          warm_standby=failure.warm_standby and failure.max_failures != 0)
    raise ConfigError(f"ScalingConfig.backend={scaling.backend!r} is not one of 'local', 'ray'.")
