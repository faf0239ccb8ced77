"""What a worker knows about its place in the run (``get_context()``)."""

from __future__ import annotations

from dataclasses import dataclass

from cairn._src.run.layout import default_checkpoint_dir_name
from cairn._src.storage.location import StorageLocation


@dataclass(frozen=True)
class RunStorage:
    """Where the run lives: ``get_context().get_storage()``."""

    run: StorageLocation

    @property
    def filesystem(self) -> object:
        return self.run.filesystem

    @property
    def run_path(self) -> str:
        """The run directory's path inside :attr:`filesystem`."""
        return self.run.path

    @property
    def run_uri(self) -> str | None:
        """A URI of the run directory that any process can resolve (None if none)."""
        return self.run.uri

    def checkpoint_location(self, dir_name: str) -> StorageLocation:
        """Where a checkpoint named ``dir_name`` lives inside the run directory."""
        return self.run.join(dir_name)

    def default_checkpoint_dir_name(self, report_index: int) -> str:
        return default_checkpoint_dir_name(report_index)


@dataclass(frozen=True)
class TrainContext:
    """Ray-compatible view of the worker's rank, world and run."""

    world_rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    experiment_name: str
    attempt: int
    storage: RunStorage

    def get_world_rank(self) -> int:
        return self.world_rank

    def get_world_size(self) -> int:
        return self.world_size

    def get_local_rank(self) -> int:
        return self.local_rank

    def get_local_world_size(self) -> int:
        return self.local_world_size

    def get_node_rank(self) -> int:
        return self.node_rank

    def get_experiment_name(self) -> str:
        return self.experiment_name

    def get_attempt(self) -> int:
        """0 for the first attempt of this run, +1 for each restart (driver restarts too)."""
        return self.attempt

    def get_storage(self) -> RunStorage:
        return self.storage
