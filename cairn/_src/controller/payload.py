"""What every worker of a run is sent: the train function, its config and hooks, pickled
once per run (:class:`WorkerPayload`), and each rank's :class:`SetupMessage`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from cairn._src.config.run import RunConfig
from cairn._src.controller.attempt import Attempt, placement
from cairn._src.errors import ConfigError
from cairn._src.storage.location import StorageLocation
from cairn._src.storage.registry import export_registrations
from cairn._src.wire.code_locations import dumps_with_locations
from cairn._src.wire.datasets import DatasetSplit
from cairn._src.wire.messages import RestorePlan, SetupMessage


@dataclass
class TrainSpec:
    train_fn: Callable[..., Any]
    config: Any
    pass_config: bool
    setup_hooks: list[Callable[[Any], None]] = field(default_factory=list)
    teardown_hooks: list[Callable[[Any], None]] = field(default_factory=list)
    # Called in the driver before each attempt: extra environment for its workers (for
    # example a fresh rendezvous port for torch.distributed).
    attempt_env: Callable[[int], dict[str, str]] | None = None
    # Trainer(validation_config=...): a cairn.ValidationConfig, or None.
    validation_config: Any = None
    # Trainer(datasets=...): Ray Data datasets by name, split at each attempt's start.
    datasets: dict[str, Any] = field(default_factory=dict)
    # Trainer(dataset_config=...), and Ray Data's DataContext as the Trainer was built.
    dataset_config: Any = None
    data_context: Any = None


@dataclass(frozen=True)
class WorkerPayload:
    """The run's pickled parts, the same for every worker of every attempt."""

    train_fn: bytes
    config: bytes
    registrations: bytes
    retry: bytes
    setup_hooks: bytes
    teardown_hooks: bytes

    @classmethod
    def pickle(cls, spec: TrainSpec, run_config: RunConfig, *,
               in_driver: bool = False) -> WorkerPayload:
        """``in_driver`` (local mode): the one worker runs in the driver with the user's own
        objects, so the function, its config and the hooks travel nowhere and need not
        pickle (a closure over a lock, a queue of results)."""
        return cls(
            # File names and line numbers of the user's code survive the trip, for the
            # tracebacks of failed ranks (code_locations).
            train_fn=b"" if in_driver else dumps_with_locations(spec.train_fn),
            config=b"" if in_driver else cloudpickle.dumps(spec.config),
            registrations=_pickle_registrations(),
            retry=cloudpickle.dumps(run_config.storage_retry),
            setup_hooks=b"" if in_driver else cloudpickle.dumps(spec.setup_hooks),
            teardown_hooks=b"" if in_driver else cloudpickle.dumps(spec.teardown_hooks),
        )


def _pickle_registrations() -> bytes:
    registrations = export_registrations()
    for scheme, factory in registrations.items():
        try:
            cloudpickle.dumps(factory)
        except Exception as exc:
            raise ConfigError(
                f"The storage factory registered for scheme {scheme!r} cannot be pickled "
                f"({type(exc).__name__}: {exc}), so worker processes cannot reach the store. "
                "Register a function defined in an importable module, keep no open "
                "connections or locks in the factory's closure, or register the store "
                "through the 'cairn.storage' entry point."
            ) from exc
    return bytes(cloudpickle.dumps(registrations))


@dataclass(frozen=True)
class SetupFactory:
    """Builds each rank's :class:`SetupMessage` for one attempt."""

    spec: TrainSpec
    payload: WorkerPayload
    run_config: RunConfig
    run: StorageLocation
    experiment_name: str
    storage_token: str | None
    dataset_split: DatasetSplit | None
    keep_survivors: bool = False
    # keep_survivors: where each rank restores from (survivors.plan_restores).
    restores: Mapping[int, RestorePlan] = field(default_factory=dict)

    def message(self, attempt: Attempt, rank: int) -> SetupMessage:
        payload = self.payload
        checkpoint_config = self.run_config.checkpoint_config
        local_rank, local_world_size, node_rank = placement(attempt.workers)[rank]
        return SetupMessage(
            rank=rank,
            world_size=len(attempt.workers),
            local_rank=local_rank,
            local_world_size=local_world_size,
            node_rank=node_rank,
            attempt=attempt.number,
            experiment_name=self.experiment_name,
            run=self.run,
            train_fn=payload.train_fn,
            config=payload.config,
            pass_config=self.spec.pass_config,
            resume=attempt.resume,
            first_report_index=attempt.first_report_index,
            score_attribute=checkpoint_config.checkpoint_score_attribute,
            max_pending_uploads=checkpoint_config.max_pending_uploads,
            upload_failure_policy=checkpoint_config.upload_failure_policy,
            retry=payload.retry,
            transfer=self.run_config.storage_transfer,
            fsync=self.run_config.storage_fsync,
            setup_hooks=payload.setup_hooks,
            teardown_hooks=payload.teardown_hooks,
            validation=self.spec.validation_config is not None,
            storage_token=self.storage_token,
            dataset_names=tuple(self.spec.datasets),
            dataset_shards=(self.dataset_split.payloads[rank] if self.dataset_split
                            else None),
            local_tier_bytes=checkpoint_config.local_tier_bytes,
            local_tier_dir=checkpoint_config.local_tier_dir,
            keep_survivors=self.keep_survivors,
            restore=self.restores.get(rank),
        )
