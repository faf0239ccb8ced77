"""``ScalingConfig``: how many workers to run, and where.

Its positional arguments are Ray Train 2.60's, in Ray's order (``trainer_resources`` first,
a removed argument, as in Ray); the arguments only Cairn has are keyword-only.
"""

from __future__ import annotations

import math
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from cairn._src import migration
from cairn._src.config.checks import left_out
from cairn._src.errors import ConfigDeprecationError, ConfigError
from cairn._src.field_types import check_field_types

BACKENDS = ("local", "ray")


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_num_workers(value: object) -> None:
    accepted = ("an integer >= 1, 0 (local mode: the train function runs in this process), "
                "or a (min_workers, max_workers) tuple of integers with "
                "1 <= min_workers <= max_workers, such as (2, 4)")
    # Each message ends with Ray Train's words for the mistake, for ported tests' match=.
    counts = value if isinstance(value, tuple) else (value,)
    if counts and all(map(_is_count, counts)) and min(counts) < 0:
        raise ConfigError(f"ScalingConfig.num_workers={value!r} must be {accepted} (Ray Train: "
                          f"Invalid ScalingConfig(num_workers={value!r}): Number of workers "
                          "cannot be negative.)")
    if isinstance(value, int) and _is_count(value):
        return
    if not (isinstance(value, tuple) and len(value) == 2 and all(map(_is_count, value))):
        hint = (" (a tuple, not a list)" if isinstance(value, list) and len(value) == 2
                else "")
        raise ConfigError(f"ScalingConfig.num_workers={value!r} must be {accepted}{hint} (Ray "
                          "Train: ScalingConfig(num_workers) must be an int or a tuple of two "
                          "ints.)")
    low, high = value
    if low < 1:
        raise ConfigError(
            f"ScalingConfig.num_workers={value!r}: min_workers={low} must be >= 1; "
            f"num_workers must be {accepted}."
        )
    if low > high:
        raise ConfigError(
            f"ScalingConfig.num_workers={value!r}: min_workers={low} is greater than "
            f"max_workers={high}; num_workers must be {accepted} (Ray Train: Invalid "
            f"ScalingConfig(num_workers={value!r}): min_workers={low} must be <= "
            f"max_workers={high}.)"
        )


def _trainer_resources_message(value: object) -> str:
    if not _is_count(value) and not isinstance(value, tuple):
        return migration.TRAINER_RESOURCES
    # ScalingConfig(2): Ray Train 2.60 takes the 2 for trainer_resources too, and raises.
    return (f"{migration.TRAINER_RESOURCES} ScalingConfig(trainer_resources={value!r}) looks "
            "like a number of workers given by position: the first positional argument is "
            "trainer_resources, as in Ray Train; pass ScalingConfig(num_workers="
            f"{value!r}) instead.")


@dataclass(frozen=True)
class ScalingConfig:
    """How many workers to run, and where.

    ``backend`` picks who starts the worker processes: ``"local"`` (processes on this
    machine, the default) or ``"ray"`` (actors on a Ray cluster).

    ``accelerator_type`` (for example ``"A100"``) names the accelerator the workers' nodes
    must have, as in Ray Train: it becomes the resource ``accelerator_type:<type>`` (0.001
    per worker) in :attr:`additional_resources_per_worker` and :attr:`total_resources`, for
    a cluster scheduler. The ``local`` backend runs on this machine, whatever its
    accelerator: the value is accepted and recorded, and selects nothing.

    ``num_workers`` is a number of workers, or a ``(min_workers, max_workers)`` tuple for
    an elastic run, as in Ray Train: a backend starts as many workers as fit within the
    bounds at each (re)start, and ``get_context().get_world_size()`` says how many it
    got. The ``local`` backend always starts ``max_workers``. What is restored when the
    world size changes: ``docs/elastic.md``. ``num_workers=0`` is Ray Train's local mode
    (:attr:`local_mode`, ``docs/local-mode.md``).

    ``tls`` encrypts the control channel between the driver and its workers (TLS 1.3,
    a certificate made per run); ``None`` reads the ``CAIRN_TLS`` environment variable
    (``1`` on, ``0`` off; unset: off). See ``docs/security.md``.

    The positional arguments are Ray Train 2.60's, in its order: ``trainer_resources``
    (removed in Ray v2; anything but None raises :class:`ConfigDeprecationError`, as Ray
    raises), ``num_workers``, ``use_gpu``, ``resources_per_worker``,
    ``placement_strategy``, ``accelerator_type``. ``backend`` and ``tls`` are Cairn's,
    keyword-only.
    """

    # Ray's first positional argument (ray.air.config.ScalingConfig's first field).
    trainer_resources: Any = field(default=None, repr=False, compare=False)
    num_workers: int | tuple[int, int] = 1
    use_gpu: bool = False
    resources_per_worker: dict[str, float] | None = None
    placement_strategy: str = "PACK"
    accelerator_type: str | None = None
    # Ray's next argument, label_selector, is not supported: a 7th positional argument is
    # a TypeError rather than a value taken for one of Cairn's own fields.
    _: KW_ONLY
    backend: str = "local"
    tls: bool | None = None

    def __post_init__(self) -> None:
        # None is Ray's default; "DEPRECATED" was Cairn's, and a config pickled with it
        # can still be rebuilt with dataclasses.replace().
        if self.trainer_resources is not None and not left_out(self.trainer_resources):
            raise ConfigDeprecationError(_trainer_resources_message(self.trainer_resources))
        _check_num_workers(self.num_workers)
        if self.tls is not None and not isinstance(self.tls, bool):
            raise ConfigError(
                f"ScalingConfig.tls={self.tls!r} must be True (encrypt the control channel), "
                "False, or None (the CAIRN_TLS environment variable decides; unset: off).")
        # Before the checks below read use_gpu: "false" is truthy.
        check_field_types(self)
        if self.accelerator_type is not None and not (
            isinstance(self.accelerator_type, str) and self.accelerator_type
        ):
            raise ConfigError(
                f"ScalingConfig.accelerator_type={self.accelerator_type!r} must be a non-empty "
                "string (for example 'A100') or None.")
        if self.resources_per_worker is not None:
            if not isinstance(self.resources_per_worker, dict) or not all(
                isinstance(k, str) and not isinstance(v, bool) and isinstance(v, (int, float))
                and 0 <= v < math.inf for k, v in self.resources_per_worker.items()
            ):
                raise ConfigError(
                    f"ScalingConfig.resources_per_worker={self.resources_per_worker!r} must "
                    "be a dict of resource names to finite numbers >= 0 (for example "
                    "{'CPU': 2}).")
            gpus = self.resources_per_worker.get("GPU", 0)
            if not self.use_gpu and gpus > 0:
                raise ConfigError(
                    "`use_gpu` is False but `GPU` was found in `resources_per_worker`. "
                    "Either set `use_gpu` to True or remove `GPU` from "
                    "`resources_per_worker` (ScalingConfig.resources_per_worker="
                    f"{self.resources_per_worker!r}).")
            if self.use_gpu and "GPU" in self.resources_per_worker and gpus == 0:
                raise ConfigError(
                    "`use_gpu` is True but `GPU` is set to 0 in `resources_per_worker`. "
                    "Either set `use_gpu` to False or request a positive number of `GPU` "
                    "in `resources_per_worker`.")
        if self.backend not in BACKENDS:
            raise ConfigError(f"ScalingConfig.backend={self.backend!r} is not one of "
                              + ", ".join(repr(b) for b in BACKENDS) + ".")
        if self.local_mode and self.backend != "local":
            raise ConfigError(
                f"ScalingConfig(num_workers=0, backend={self.backend!r}): num_workers=0 is "
                "local mode, which runs the train function in this process and starts no "
                "workers on any backend; drop backend= (or use 'local'), or ask for "
                "num_workers >= 1 to run on Ray.")
        strategies = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
        if self.placement_strategy not in strategies:
            raise ConfigError(f"ScalingConfig.placement_strategy={self.placement_strategy!r} "
                              "is not one of " + ", ".join(repr(s) for s in strategies) + ".")

    @property
    def local_mode(self) -> bool:
        """Whether ``num_workers`` is 0: the train function runs in the driver's process, on
        the thread that called ``fit()``, as rank 0 of a world of 1 (Ray Train's local
        mode), with checkpoints committed as in any run."""
        return self.num_workers == 0

    @property
    def elasticity_enabled(self) -> bool:
        """Whether ``num_workers`` is a ``(min_workers, max_workers)`` range."""
        return isinstance(self.num_workers, tuple)

    @property
    def min_workers(self) -> int:
        """The fewest workers a (re)start may run with (``num_workers`` when fixed)."""
        return self.num_workers if isinstance(self.num_workers, int) else self.num_workers[0]

    @property
    def max_workers(self) -> int:
        """The most workers a (re)start asks for (``num_workers`` when fixed)."""
        return self.num_workers if isinstance(self.num_workers, int) else self.num_workers[1]

    @property
    def num_cpus_per_worker(self) -> float:
        return self._resources_per_worker_not_none.get("CPU", 0)

    @property
    def num_gpus_per_worker(self) -> float:
        return self._resources_per_worker_not_none.get("GPU", 0)

    @property
    def additional_resources_per_worker(self) -> dict[str, float]:
        """Resources per worker besides CPU and GPU (the accelerator-type constraint too)."""
        return {k: v for k, v in self._resources_per_worker_not_none.items()
                if k not in ("CPU", "GPU")}

    @property
    def _resources_per_worker_not_none(self) -> dict[str, float]:
        # As Ray Train: a GPU worker asks for no CPU by default (nodes have more CPUs than
        # GPUs), a CPU worker for one CPU; resources given as 0 are dropped.
        if self.resources_per_worker is None:
            resources: dict[str, float] = {"GPU": 1} if self.use_gpu else {"CPU": 1}
        else:
            resources = {k: v for k, v in self.resources_per_worker.items() if v != 0}
        if self.use_gpu:
            resources.setdefault("GPU", 1)
        if self.accelerator_type:
            resources[f"accelerator_type:{self.accelerator_type}"] = 0.001
        return resources

    @property
    def total_resources(self) -> dict[str, float]:
        """What the whole worker group asks for: per-worker resources times the number of
        workers (``max_workers`` for an elastic range: an upper bound)."""
        return {k: v * self.max_workers for k, v in self._resources_per_worker_not_none.items()}
