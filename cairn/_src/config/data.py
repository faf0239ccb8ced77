"""``DataConfig``: how ``Trainer(datasets=...)`` hands Ray Data to the workers.

The arguments and their meaning are Ray Train 2.60's ``ray.train.DataConfig``:

* ``datasets_to_split``: ``"all"`` (the default) or a list of dataset names. A dataset
  named there is split into one equal shard per worker (``streaming_split(world_size,
  equal=True)``); any other dataset is given whole to every worker (``Dataset.iterator()``).
* ``execution_options``: Ray Data ``ExecutionOptions`` for every dataset, or a dict of
  dataset names to options (the datasets it does not name get
  :meth:`DataConfig.default_ingest_options`); None (the default): the default for all.
* ``enable_shard_locality``: each shard is produced near its worker (the split's
  ``locality_hints`` are the workers' Ray nodes).

:meth:`DataConfig.configure` is the extension point, as in Ray: a subclass may override it
to build each worker's iterators itself. Cairn calls it once per dataset, at each start
of the worker group, with ``datasets={name: dataset}``, the world size of that attempt,
``worker_handles=None`` and the workers' Ray node ids. It runs in the driver, where Ray
is connected; nothing here imports Ray until it is needed.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cairn._src.errors import ConfigError


def _execution_options_type() -> type:
    try:
        from ray.data import ExecutionOptions
    except ImportError as exc:
        raise ConfigError(
            "DataConfig(execution_options=...) needs Ray Data: pip install 'ray[data]' "
            f"(import failed: {exc})."
        ) from exc
    return ExecutionOptions


@dataclass(frozen=True)
class DataConfig:
    """Which datasets are split among the workers, and Ray Data's options for them."""

    datasets_to_split: str | Sequence[str] = "all"
    execution_options: Any = None
    enable_shard_locality: bool = True

    def __post_init__(self) -> None:
        split = self.datasets_to_split
        if isinstance(split, str):
            if split != "all":
                raise ConfigError(
                    f"DataConfig.datasets_to_split={split!r}: `datasets_to_split` should be "
                    "a 'all' or a list of strings of dataset names; a single name goes in a "
                    f"list: datasets_to_split=[{split!r}]."
                )
        elif not isinstance(split, (list, tuple)) or not all(
                isinstance(name, str) and name for name in split):
            raise ConfigError(
                f"DataConfig.datasets_to_split={split!r}: `datasets_to_split` should be a "
                "'all' or a list of strings of dataset names, such as ['train'] "
                f"(received {type(split).__name__})."
            )
        else:
            object.__setattr__(self, "datasets_to_split", list(split))
        if not isinstance(self.enable_shard_locality, bool):
            raise ConfigError(
                f"DataConfig.enable_shard_locality={self.enable_shard_locality!r} must be "
                "True or False."
            )
        options = self.execution_options
        if options is None:
            return
        accepted = _execution_options_type()
        if isinstance(options, Mapping):
            for name, value in options.items():
                if not isinstance(name, str) or not isinstance(value, accepted):
                    raise ConfigError(
                        f"DataConfig.execution_options={{{name!r}: "
                        f"{type(value).__name__}}}: a dict of execution options maps "
                        "dataset names to ray.data.ExecutionOptions, such as "
                        "{'train': DataConfig.default_ingest_options()}."
                    )
            object.__setattr__(self, "execution_options", dict(options))
        elif not isinstance(options, accepted):
            raise ConfigError(
                f"DataConfig.execution_options={type(options).__name__} must be a "
                "ray.data.ExecutionOptions, a dict of dataset names to them, or None "
                "(DataConfig.default_ingest_options() gives the default to start from)."
            )

    def split_names(self, names: Sequence[str]) -> set[str]:
        """Of the datasets ``names``, those split into one shard per worker."""
        if self.datasets_to_split == "all":
            return set(names)
        return set(self.datasets_to_split) & set(names)

    def execution_options_for(self, name: str) -> Any:
        """A copy of the options dataset ``name`` runs with (the caller may change it)."""
        options = self.execution_options
        if isinstance(options, dict):
            options = options.get(name)
        return copy.deepcopy(options if options is not None else self.default_ingest_options())

    def configure(self, datasets: dict[str, Any], world_size: int,
                  worker_handles: list[Any] | None, worker_node_ids: list[str] | None,
                  **kwargs: Any) -> list[dict[str, Any]]:
        """Each worker's ``{name: DataIterator}``, ``world_size`` of them (Ray's contract).

        Every dataset runs on a copy of itself, with its execution options: a split
        consumes the dataset's plan, and the next start of the worker group splits again.
        """
        shards: list[dict[str, Any]] = [{} for _ in range(world_size)]
        split = self.split_names(list(datasets))
        hints = (list(worker_node_ids) if self.enable_shard_locality and worker_node_ids
                 else None)
        for name, dataset in datasets.items():
            if dataset.name is None:
                dataset.set_name(name)
            own = dataset.copy(dataset)
            own.context.execution_options = self.execution_options_for(name)
            if name in split:
                iterators = own.streaming_split(world_size, equal=True, locality_hints=hints)
            else:
                iterators = [own.iterator() for _ in range(world_size)]
            for rank, iterator in enumerate(iterators):
                shards[rank][name] = iterator
        return shards

    @staticmethod
    def default_ingest_options() -> Any:
        """Ray Data's ``ExecutionOptions`` for ingest: the resource limits, excluded
        resources, order and progress settings of the current ``DataContext``."""
        from ray.data import ExecutionOptions
        from ray.data.context import DataContext

        current = DataContext.get_current().execution_options
        excluded = current.exclude_resources
        return ExecutionOptions(
            resource_limits=current.resource_limits,
            # Ray Data deprecated this setting: passed on only where someone set it.
            exclude_resources=None if excluded.is_zero() else excluded,
            preserve_order=current.preserve_order,
            verbose_progress=current.verbose_progress,
        )
