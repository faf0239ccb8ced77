"""Backends start worker processes and tell the controller when one dies; nothing else.

Both backends run the same worker runtime (``worker_main.run_from_bootstrap``), which
connects back to the controller; the controller waits on each worker's ``exit_watcher``
(something with a ``fileno()`` that becomes readable when the worker is gone) together
with the connections, so a death is noticed at once, never by polling.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from cairn._src.errors import ConfigError

if TYPE_CHECKING:
    from cairn._src.config import RunConfig, ScalingConfig
    from cairn._src.execution.local_backend import Bootstrap


class ExitWatcher(Protocol):
    def fileno(self) -> int: ...


class WorkerHandle(Protocol):
    @property
    def rank(self) -> int: ...

    @property
    def exit_watcher(self) -> ExitWatcher: ...

    @property
    def pid(self) -> int: ...

    @property
    def node_id(self) -> str:
        """Which machine the worker runs on (ranks on one node share local ranks)."""

    def describe_exit(self) -> str:
        """How the worker ended, for error messages ("was killed by SIGKILL")."""

    def wait_exit(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the worker to end; whether it has."""


class WorkerBackend(Protocol):
    name: str
    # Where the controller listens: loopback for local workers, every interface for a
    # cluster (``advertise_host`` is then the address workers connect to).
    bind_host: str

    def advertise_host(self) -> str: ...

    def start(self, num_workers: int, bootstrap: Bootstrap, *,
              env: dict[str, str] | None = None) -> list[WorkerHandle]: ...

    def shutdown(self, *, grace_s: float = 5.0) -> None: ...

    def kill(self) -> None: ...


def make_backend(scaling: ScalingConfig, run_config: RunConfig) -> WorkerBackend:
    """The backend ``scaling.backend`` names; Ray is imported only when asked for."""
    if scaling.backend == "local":
        from cairn._src.execution.local_backend import LocalBackend

        failure = run_config.failure_config
        return LocalBackend(forward_output=run_config.log_to_driver, env=run_config.worker_env,
                            warm_standby=failure.warm_standby and failure.max_failures != 0)
    if scaling.backend == "ray":
        try:
            from cairn._src.execution.ray_backend import RayBackend
        except ImportError as exc:
            raise ConfigError(
                "ScalingConfig(backend='ray') needs Ray: pip install 'cairn-train[ray]' "
                f"(import failed: {exc})."
            ) from exc
        return RayBackend(scaling, env=run_config.worker_env)
    raise ConfigError(f"ScalingConfig.backend={scaling.backend!r} is not one of 'local', 'ray'.")
