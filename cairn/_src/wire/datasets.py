"""Ray Data datasets for the workers: ``Trainer(datasets=...)``, ``get_dataset_shard()``.

As in Ray Train: at every start of the worker group, the driver splits each dataset into
one shard per worker with ``Dataset.streaming_split(world_size, equal=True,
locality_hints=<the workers' node ids>)``, so the shards follow the world size of that
attempt (an elastic restart with fewer workers gets fewer, larger shards), and every
worker streams its shard through ``get_dataset_shard(name)``, a ``ray.data.DataIterator``.
Ray Data runs on the Ray cluster, so datasets need the Ray backend.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import cloudpickle

from cairn._src.errors import ConfigError


def check_datasets(datasets: object, *, backend: str) -> dict[str, Any]:
    """``Trainer(datasets=...)`` validated: a dict of names to ``ray.data.Dataset``."""
    if datasets is None:
        return {}
    if not isinstance(datasets, Mapping) or not all(
        isinstance(name, str) and name for name in datasets
    ):
        raise ConfigError(
            f"Trainer(datasets={datasets!r}) must be a dict of non-empty names to "
            "ray.data.Dataset objects, such as {'train': ray.data.read_parquet(...)}."
        )
    if not datasets:
        return {}
    if backend != "ray":
        raise ConfigError(
            f"Trainer(datasets={{{', '.join(repr(n) for n in datasets)}: ...}}) needs the Ray "
            f"backend, and ScalingConfig.backend={backend!r}: Ray Data shards stream from the "
            "Ray cluster. Pass ScalingConfig(backend='ray'), or read the data in the train "
            "function (cairn.torch.prepare_data_loader shards a DataLoader)."
        )
    try:
        from ray.data import Dataset
    except ImportError as exc:
        raise ConfigError(
            "Trainer(datasets=...) needs Ray Data: pip install 'ray[data]' "
            f"(import failed: {exc})."
        ) from exc
    for name, dataset in datasets.items():
        if not isinstance(dataset, Dataset):
            raise ConfigError(
                f"Trainer(datasets={{{name!r}: {type(dataset).__name__}}}): "
                f"datasets[{name!r}] must be a ray.data.Dataset, not "
                f"{type(dataset).__name__}; build it with ray.data (ray.data.from_items, "
                "read_parquet, ...)."
            )
    return dict(datasets)


@dataclass(frozen=True)
class DatasetSplit:
    """One attempt's shards: ``payloads[rank]`` is rank's pickled ``{name: DataIterator}``.

    The driver must keep this object for as long as the attempt runs: its iterators hold
    the split coordinators (Ray actors owned by the driver), which pickled copies in the
    workers do not keep alive.
    """

    iterators: list[dict[str, Any]]
    payloads: list[bytes]


def split_datasets(datasets: Mapping[str, Any], node_ids: list[str]) -> DatasetSplit:
    """One shard of every dataset per rank, for ``len(node_ids)`` workers.

    Runs in the driver at each start of the worker group; ``node_ids[rank]`` is where
    rank ``rank`` runs, so each shard is produced near its worker, as in Ray Train.
    """
    world_size = len(node_ids)
    shards: list[dict[str, Any]] = [{} for _ in range(world_size)]
    for name, dataset in datasets.items():
        if dataset.name is None:
            dataset.set_name(name)
        # A copy per attempt: a split consumes the dataset's execution plan.
        copy = dataset.copy(dataset)
        splits = copy.streaming_split(world_size, equal=True, locality_hints=list(node_ids))
        for rank, split in enumerate(splits):
            shards[rank][name] = split
    return DatasetSplit(shards, [bytes(cloudpickle.dumps(shard)) for shard in shards])


class DatasetShards:
    """A worker's shards, unpickled on first use (that needs Ray, in a Ray worker)."""

    def __init__(self, names: tuple[str, ...], payload: bytes | None) -> None:
        self._names = names
        self._payload = payload
        self._shards: dict[str, Any] | None = None

    def get(self, name: str | None) -> Any:
        """The shard of the dataset ``name`` (``None``: the only dataset there is)."""
        if not self._names:
            raise ConfigError(
                f"get_dataset_shard({name!r}): the Trainer was given no datasets. Pass "
                "Trainer(..., datasets={'train': ray_dataset}) to stream Ray Data shards."
            )
        if name is None:
            if len(self._names) != 1:
                raise ConfigError(
                    "get_dataset_shard() without a name needs exactly one dataset; the "
                    f"Trainer has {len(self._names)}: {', '.join(map(repr, self._names))}. "
                    "Pass one of those names."
                )
            name = self._names[0]
        if name not in self._names:
            raise ConfigError(
                f"get_dataset_shard({name!r}): the Trainer has no dataset named {name!r}; "
                f"it has {', '.join(map(repr, self._names))} (Trainer(datasets=...))."
            )
        if self._shards is None:
            assert self._payload is not None
            self._shards = cloudpickle.loads(self._payload)
        return self._shards[name]
