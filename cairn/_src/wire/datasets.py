"""Ray Data datasets for the workers: ``Trainer(datasets=...)``, ``get_dataset_shard()``.

As in Ray Train: at every start of the worker group, the driver has the run's
``DataConfig`` build each worker's iterators (by default ``Dataset.streaming_split(
world_size, equal=True, locality_hints=<the workers' Ray nodes>)`` for every dataset), so
the shards follow the world size of that attempt (an elastic restart with fewer workers
gets fewer, larger shards), and every worker streams its shard through
``get_dataset_shard(name)``, a ``ray.data.DataIterator``.

Ray Data runs on a Ray instance the driver is connected to: the Ray backend's cluster, or
for the local backend the one the driver already has or starts for the data alone
(``controller/datasets.py``). A worker's shards travel as :class:`ShardPayload`: the Ray
address and the pickled iterators, which a worker unpickles once it is connected to that
Ray instance. A Ray actor already is; a local worker process connects to it as a Ray
driver of its own the first time it asks for a shard, keeping its signal handlers
(:func:`_init_keeping_signal_handlers`).
"""

from __future__ import annotations

import copy
import logging
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import cloudpickle

from cairn._src.config.data import DataConfig
from cairn._src.errors import ConfigError

logger = logging.getLogger(__name__)


def _dataset_type() -> type:
    try:
        from ray.data import Dataset
    except ImportError as exc:
        raise ConfigError(
            "Trainer(datasets=...) needs Ray Data: pip install 'ray[data]' "
            f"(import failed: {exc})."
        ) from exc
    return Dataset


def check_datasets(datasets: object) -> dict[str, Any]:
    """``Trainer(datasets=...)`` validated: a dict of names to ``ray.data.Dataset`` objects,
    or to functions that return one (called at each start of the worker group)."""
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
    dataset_type = _dataset_type()
    for name, dataset in datasets.items():
        if not isinstance(dataset, dataset_type) and not callable(dataset):
            raise ConfigError(
                f"Trainer(datasets={{{name!r}: {type(dataset).__name__}}}): "
                f"datasets[{name!r}] must be a ray.data.Dataset (or a function that returns "
                f"one), not {type(dataset).__name__}; build it with ray.data "
                "(ray.data.from_items, read_parquet, ...)."
            )
    return dict(datasets)


def _is_ray_data_config(config: object) -> bool:
    ray_train = sys.modules.get("ray.train")
    ray_config = getattr(ray_train, "DataConfig", None)
    return isinstance(ray_config, type) and isinstance(config, ray_config)


def check_dataset_config(config: object, datasets: Mapping[str, Any]) -> Any:
    """``Trainer(dataset_config=...)`` validated against the datasets: a
    :class:`cairn.DataConfig` (or a subclass), or Ray's own ``ray.train.DataConfig``."""
    if config is None:
        return DataConfig()
    if isinstance(config, DataConfig):
        split = config.datasets_to_split
    elif _is_ray_data_config(config):
        split = getattr(config, "_datasets_to_split", "all")
    else:
        raise ConfigError(
            f"Trainer(dataset_config={config!r}) must be a cairn.DataConfig (or "
            "ray.train.DataConfig), such as DataConfig(datasets_to_split=['train'])."
        )
    if datasets and split != "all":
        missing = [name for name in split if name not in datasets]
        if missing:
            raise ConfigError(
                f"DataConfig(datasets_to_split={list(split)!r}) names "
                f"{', '.join(map(repr, missing))}, which Trainer(datasets=...) does not "
                f"have; it has {', '.join(map(repr, datasets))}."
            )
    return config


def dataset_type_check(name: str, value: Any) -> Any:
    """``value``, the dataset ``name`` of this attempt: a dataset, or what its function
    returned, which must be one."""
    dataset = value() if callable(value) and not isinstance(value, _dataset_type()) else value
    if not isinstance(dataset, _dataset_type()):
        raise ConfigError(
            f"Trainer(datasets={{{name!r}: {getattr(value, '__name__', value)!r}}}): the "
            f"function returned {type(dataset).__name__}, not a ray.data.Dataset."
        )
    return dataset


def current_data_context() -> Any:
    """A copy of the driver's Ray Data ``DataContext``, which the workers then use."""
    from ray.data import DataContext

    return copy.deepcopy(DataContext.get_current())


@dataclass(frozen=True)
class ShardPayload:
    """What one worker is sent: where Ray Data runs, and its pickled iterators (with the
    driver's ``DataContext`` to set, None in local mode), unpickled only once connected
    there."""

    ray_address: str | None
    iterators: bytes


@dataclass(frozen=True)
class DatasetSplit:
    """One attempt's shards: ``payloads[rank]`` is rank's pickled :class:`ShardPayload`.

    The driver must keep this object for as long as the attempt runs: its iterators hold
    the split coordinators (Ray actors owned by the driver), which pickled copies in the
    workers do not keep alive.
    """

    iterators: list[dict[str, Any]]
    payloads: list[bytes]


def pack_shards(shards: list[dict[str, Any]], *, ray_address: str | None,
                data_context: Any) -> DatasetSplit:
    """Each rank's payload for ``shards[rank]``, the iterators ``DataConfig`` built."""
    payloads = [
        bytes(cloudpickle.dumps(ShardPayload(ray_address, cloudpickle.dumps((data_context,
                                                                            shard)))))
        for shard in shards
    ]
    return DatasetSplit(shards, payloads)


class _NoSigtermNotice(logging.Filter):
    """Drops Ray's warning that it set no SIGTERM handler (off the main thread)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "SIGTERM handler is not set" not in record.getMessage()


def _init_keeping_signal_handlers(address: str) -> None:
    """``ray.init(address=address)``, leaving this process's signal handlers as they are.

    On the main thread Ray's init replaces the SIGTERM handler with one that exits the
    process (``sys.exit(15)``); in a local worker SIGTERM is the preemption notice
    (``worker/preemption.py``), and a worker that exits on it fails the attempt, a failure
    counted against ``max_failures``. Off the main thread Ray sets no handler (a Python
    handler can only be set there) and only warns that it did not, so the init runs on a
    thread of its own, its warning dropped, while the main thread waits and still runs
    the worker's handlers: a SIGTERM during the init, too, is a notice. Ray's crash
    reporter for fatal signals (SIGSEGV, SIGABRT, ...), which it sets below Python, stays.
    """
    import ray

    failure: list[BaseException] = []

    def init() -> None:
        try:
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        except BaseException as exc:
            failure.append(exc)

    ray_logger = logging.getLogger("ray._private.worker")
    notice = _NoSigtermNotice()
    ray_logger.addFilter(notice)
    try:
        thread = threading.Thread(target=init, name="cairn-ray-init", daemon=True)
        thread.start()
        thread.join()
    finally:
        ray_logger.removeFilter(notice)
    if failure:
        raise failure[0]


def _connect_ray(address: str | None) -> None:
    import ray

    if ray.is_initialized():
        current = ray.get_runtime_context().gcs_address
        if address is not None and current != address:
            raise ConfigError(
                f"get_dataset_shard(): this worker is connected to the Ray instance at "
                f"{current}, but the datasets run on the driver's, at {address}. Call "
                "get_dataset_shard() before anything in the train function starts Ray "
                "(building a ray.data dataset there does), or connect to the driver's "
                f"with ray.init(address={address!r})."
            )
        return
    if address is None:
        raise ConfigError(
            "get_dataset_shard(): this worker is not connected to Ray and the driver sent "
            "no Ray address to connect to."
        )
    started = time.monotonic()
    _init_keeping_signal_handlers(address)
    logger.info("Connected to Ray at %s for the datasets' shards in %.2fs", address,
                time.monotonic() - started)


class DatasetShards:
    """A worker's shards, unpickled on first use (that needs Ray, connected first)."""

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
            self._shards = self._load(self._payload)
        return self._shards[name]

    @staticmethod
    def _load(payload: bytes) -> dict[str, Any]:
        shard_payload: ShardPayload = cloudpickle.loads(payload)
        _connect_ray(shard_payload.ray_address)
        data_context, shards = cloudpickle.loads(shard_payload.iterators)
        if data_context is not None:
            # The driver's Ray Data settings, as Ray Train propagates them to its workers.
            from ray.data import DataContext

            DataContext._set_current(data_context)
        return dict(shards)
