"""The driver's side of ``Trainer(datasets=...)``: the Ray instance Ray Data runs on, and
each attempt's split.

On the Ray backend the datasets run on the backend's cluster. On the local backend the
workers are plain processes, and Ray Data needs a Ray instance all the same: the driver
uses the one it is already connected to (a user's ``ray.init()``, or the one Ray Data
started when the datasets were built), and leaves it running; otherwise it starts one on
this machine for the data alone (no dashboard, every port on 127.0.0.1) and shuts it down
when the run ends. Each local worker connects to it as a Ray driver of its own the first
time it asks for a shard (``wire/datasets.py``).

Ray Data's tasks need CPUs that the workers do not hold. On the Ray backend a group whose
workers hold every CPU of the cluster leaves none, and the first iteration of a shard
would wait, silently, until one frees up: :meth:`DataIngest.split` warns at once, naming
the cause and the fixes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from cairn._src.config.run import ScalingConfig
from cairn._src.errors import ConfigError
from cairn._src.wire.datasets import DatasetSplit, dataset_type_check, pack_shards

logger = logging.getLogger(__name__)

# What makes Ray keep a node on the loopback address (read when ``ray`` is imported).
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def _start_local_ray() -> None:
    """A Ray instance on this machine for the data alone, on 127.0.0.1.

    Ray binds a new node to the machine's address unless multi-host clusters are off, a
    switch Ray reads once, at import; it is turned off for this start only.
    """
    import ray
    from ray._private import ray_constants

    enabled = getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    if enabled is not None:
        ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        ray.init(address="local", include_dashboard=False, logging_level=logging.WARNING)
    finally:
        if enabled is not None:
            ray_constants.ENABLE_RAY_CLUSTER = enabled


class DataIngest:
    """Splits the run's datasets at each start of the worker group; owns the Ray instance
    it started, if any. Used by the controller loop's thread only."""

    def __init__(self, datasets: dict[str, Any], config: Any, data_context: Any,
                 scaling: ScalingConfig, *, cpus_per_worker: Callable[[], float]) -> None:
        self._datasets = datasets
        self._config = config
        # Ray Data's DataContext as the Trainer was built, set in each worker process as
        # Ray Train does. In local mode the train function runs in this process, whose
        # current DataContext stays the user's, as in Ray Train's local mode.
        self._data_context = None if scaling.local_mode else data_context
        self._backend = scaling.backend
        self._cpus_per_worker = cpus_per_worker
        self._started_ray = False
        self._address: str | None = None
        self._split: DatasetSplit | None = None

    def worker_env(self) -> dict[str, str]:
        """Connects the driver to Ray (once); what local workers need in their environment
        to connect to it too."""
        import ray

        if self._address is None:
            if not ray.is_initialized():
                logger.info("Starting a local Ray instance for Trainer(datasets=...)")
                _start_local_ray()
                self._started_ray = True
            self._address = ray.get_runtime_context().gcs_address
        if self._backend == "ray":
            return {}
        loopback = str(ray.util.get_node_ip_address()).startswith(  # type: ignore[no-untyped-call]
            "127.")
        return {LOOPBACK_ENV: "0"} if loopback else {}

    def split(self, node_ids: list[str]) -> DatasetSplit:
        """One attempt's shards for workers on ``node_ids`` (local workers: this node)."""
        import ray

        self.worker_env()
        self._release()
        world_size = len(node_ids)
        if self._backend != "ray":
            node_ids = [ray.get_runtime_context().get_node_id()] * world_size
        self._warn_if_no_cpu_for_data(world_size)
        shards: list[dict[str, Any]] = [{} for _ in range(world_size)]
        for name, value in self._datasets.items():
            dataset = dataset_type_check(name, value)
            built = self._config.configure(datasets={name: dataset}, world_size=world_size,
                                           worker_handles=None, worker_node_ids=node_ids)
            if (not isinstance(built, list) or len(built) != world_size
                    or not all(isinstance(s, dict) and name in s for s in built)):
                raise ConfigError(
                    f"{type(self._config).__name__}.configure() must return a list of "
                    f"{world_size} dicts (one per worker), each with the dataset {name!r}; "
                    f"it returned {type(built).__name__}"
                    f"{f' of {len(built)}' if isinstance(built, list) else ''}."
                )
            for rank, shard in enumerate(built):
                shards[rank][name] = shard[name]
        self._split = pack_shards(shards, ray_address=self._address,
                                  data_context=self._data_context)
        return self._split

    def _warn_if_no_cpu_for_data(self, world_size: int) -> None:
        import ray

        total = float(ray.cluster_resources().get("CPU", 0.0))  # type: ignore[no-untyped-call]
        held = world_size * self._cpus_per_worker() if self._backend == "ray" else 0.0
        if total - held >= 1.0:
            return
        logger.warning(
            "Ray Data has no CPU left for Trainer(datasets=...): the Ray cluster has "
            "%g CPUs and the %d workers hold %g of them, so the datasets' read and map "
            "tasks cannot run and the workers' first get_dataset_shard() iteration waits "
            "until a CPU frees up (forever on a fixed cluster). Leave CPUs to Ray Data: "
            "fewer workers (ScalingConfig(num_workers=...)), fewer CPUs per worker "
            "(ScalingConfig(resources_per_worker={'CPU': 0.5})), or more CPUs in the "
            "cluster (ray.init(num_cpus=...), more nodes).", total, world_size, held)

    def _release(self) -> None:
        """Stop the previous attempt's split coordinators (their executors hold tasks)."""
        split, self._split = self._split, None
        if split is None:
            return
        coordinators = {id(c): c for shard in split.iterators for iterator in shard.values()
                        if (c := getattr(iterator, "_coord_actor", None)) is not None}
        for coordinator in coordinators.values():
            try:
                coordinator.shutdown_executor.remote()
            except Exception as exc:
                logger.debug("Could not stop a split coordinator: %s", exc)

    def close(self) -> None:
        """The run is over: stop the splits; shut Ray down if this run started it."""
        self._release()
        if self._started_ray:
            import ray

            logger.info("Shutting down the local Ray instance the datasets ran on")
            ray.shutdown()
            self._started_ray = False
