"""What a worker knows about its place in the run (``get_context()``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NoReturn

from cairn._src import migration
from cairn._src.errors import ConfigDeprecationError, ConfigError
from cairn._src.run.layout import default_checkpoint_dir_name
from cairn._src.storage.location import StorageLocation
from cairn._src.wire.messages import SetupMessage


@dataclass(frozen=True)
class RunStorage:
    """Where the run lives: ``get_context().get_storage()``.

    Offers the attributes of Ray Train's ``StorageContext`` that ``checkpoint_upload_fn``
    code uses: ``storage_filesystem``, ``storage_fs_path``, ``experiment_dir_name``,
    ``experiment_fs_path`` and ``build_checkpoint_path_from_name(name)``. Paths are inside
    :attr:`storage_filesystem` (on S3 ``"bucket/prefix/run"``, no scheme), as in Ray.
    """

    run: StorageLocation

    @property
    def storage_filesystem(self) -> Any:
        """The ``pyarrow.fs.FileSystem`` the run lives on."""
        return self.run.filesystem

    @property
    def experiment_fs_path(self) -> str:
        """The run directory's path inside :attr:`storage_filesystem`."""
        return self.run.path

    @property
    def experiment_dir_name(self) -> str:
        """The run directory's name (``RunConfig.name``)."""
        return self.run.path.rstrip("/").rsplit("/", 1)[-1]

    @property
    def storage_fs_path(self) -> str:
        """The path of the storage root (the run directory's parent) in the filesystem."""
        parent = self.run.path.rstrip("/").rsplit("/", 1)[0]
        return parent or "/"

    def build_checkpoint_path_from_name(self, checkpoint_name: str) -> str:
        """The path, inside :attr:`storage_filesystem`, of the checkpoint directory named
        ``checkpoint_name`` in the run directory (where an upload function writes it)."""
        if not isinstance(checkpoint_name, str) or not checkpoint_name:
            raise ConfigError(
                f"build_checkpoint_path_from_name(checkpoint_name={checkpoint_name!r}): the "
                "name must be a non-empty string, such as the dir_name given to "
                "checkpoint_upload_fn."
            )
        return self.run.join(checkpoint_name).path

    def extract_checkpoint_dir_name_from_path(self, checkpoint_path: str) -> str:
        """The checkpoint's name, relative to the run directory, from its path."""
        prefix = self.run.path.rstrip("/") + "/"
        if not checkpoint_path.startswith(prefix):
            raise ConfigError(
                f"Checkpoint path {checkpoint_path} is not under the experiment directory "
                f"{self.run.path}."
            )
        return checkpoint_path[len(prefix):]

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

    @classmethod
    def for_setup(cls, setup: SetupMessage) -> TrainContext:
        """The context of the rank and attempt a worker's ``SetupMessage`` describes."""
        return cls(world_rank=setup.rank, world_size=setup.world_size,
                   local_rank=setup.local_rank, local_world_size=setup.local_world_size,
                   node_rank=setup.node_rank, experiment_name=setup.experiment_name,
                   attempt=setup.attempt, storage=RunStorage(setup.run))

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

    # Ray Train v2 refuses these Ray Tune era methods with a DeprecationWarning; so does
    # Cairn, with what to use instead.

    def get_metadata(self) -> NoReturn:
        raise ConfigDeprecationError(migration.GET_METADATA)

    def get_trial_name(self) -> NoReturn:
        raise ConfigDeprecationError(migration.trial_method_message("get_trial_name"))

    def get_trial_id(self) -> NoReturn:
        raise ConfigDeprecationError(migration.trial_method_message("get_trial_id"))

    def get_trial_resources(self) -> NoReturn:
        raise ConfigDeprecationError(migration.trial_method_message("get_trial_resources"))

    def get_trial_dir(self) -> NoReturn:
        raise ConfigDeprecationError(migration.trial_method_message("get_trial_dir"))
