"""``FailureConfig``: what to do when a worker fails or its node is reclaimed."""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from cairn._src import migration
from cairn._src.config.checks import (
    check_finite_seconds,
    check_int,
    check_positive_float,
    left_out,
)
from cairn._src.errors import ConfigDeprecationError, ConfigError
from cairn._src.field_types import check_field_types


@dataclass(frozen=True)
class FailureConfig:
    """What to do when a worker fails.

    * ``max_failures``: how many times the worker group is restarted (``-1``: no limit,
      ``0``: fail on the first failure).
    * ``collective_timeout_s``: how long the controller waits for every rank to reach a
      checkpoint report once one rank has, before failing with an error naming the ranks
      that did not arrive.
    * ``warm_standby``: the local backend keeps one spare process per rank, started and
      with its imports done (``torch`` for :class:`cairn.torch.TorchTrainer`) while the
      attempt trains, and hands the next attempt to them after a failure: a restart skips
      interpreter start-up and imports. Costs one idle process per rank (no effect with
      ``max_failures=0``). The Ray backend keeps spare actors instead (one per rank on the
      group's nodes and one on another node; none for GPU workers).
    * ``keep_survivors``: when one rank fails (raises, exits, is killed, is lost with
      its node), the backend keeps the other ranks' processes (on Ray, their actors):
      their train functions are stopped (at their next ``report()`` or collective, or by
      the failed collective itself), their ``torch.distributed`` group is ended, and they
      call the train function again, in the same process, for the next attempt, while
      only the failed rank is started afresh. Off by default: the train function then
      runs twice in one process, so module-level state and threads it started outlive
      an attempt. The whole group restarts as before when more than one rank fails at
      once, or a rank does not stop within ``stop_timeout_s``.
    * ``stop_timeout_s``: with ``keep_survivors``, how long a surviving rank may take to
      stop its train function before the whole group is killed and restarted.
    * ``max_preemption_failures``: how many restarts after a preemption notice (a node
      being reclaimed) are allowed, counted apart from ``max_failures`` as in Ray Train
      (``-1``, the default: no limit; ``0``: fail on the first preemption).
    * ``preemption_grace_s``: how long the workers may keep running past the reclaim
      deadline before the restart (Ray's name; default 0).
    * ``preemption_deadline_s`` (Cairn): the reclaim deadline, in seconds after the notice,
      of a notice that carries none (a SIGTERM on the local backend, a drain without a
      deadline); Ray Train assumes 120 s too.
    * ``relax_collectives_on_preemption``: accepted for Ray scripts; Cairn commits a
      checkpoint only with every rank, so it has no effect (see docs/fault-tolerance.md).

    The positional arguments are Ray Train 2.60's, in its order: ``max_failures``, then the
    removed ``fail_fast`` (given, by position or by keyword: :class:`ConfigDeprecationError`,
    as Ray raises). Ray's third, ``controller_failure_limit``, is not supported, so the
    rest are keyword-only: a third positional argument is a TypeError rather than a value
    taken for another field.
    """

    max_failures: int = 0
    fail_fast: Any = field(default=migration.DEPRECATED, repr=False, compare=False)
    _: KW_ONLY
    collective_timeout_s: float = 600.0
    warm_standby: bool = False
    keep_survivors: bool = False
    stop_timeout_s: float = 30.0
    max_preemption_failures: int = -1
    preemption_grace_s: float = 0.0
    preemption_deadline_s: float = 120.0
    relax_collectives_on_preemption: bool = False

    def __post_init__(self) -> None:
        if not left_out(self.fail_fast):
            raise ConfigDeprecationError(migration.FAIL_FAST)
        check_int("FailureConfig.max_failures", self.max_failures, minimum=0, allow=(-1,))
        check_positive_float("FailureConfig.collective_timeout_s", self.collective_timeout_s)
        check_int("FailureConfig.max_preemption_failures", self.max_preemption_failures,
                   minimum=0, allow=(-1,))
        grace = self.preemption_grace_s
        if isinstance(grace, bool) or not isinstance(grace, (int, float)) or not (
                0 <= grace < float("inf")):
            raise ConfigError(f"FailureConfig.preemption_grace_s={grace!r} must be a number "
                              ">= 0 (seconds past the reclaim deadline).")
        check_finite_seconds("FailureConfig.preemption_grace_s", grace)
        check_positive_float("FailureConfig.preemption_deadline_s", self.preemption_deadline_s)
        if not isinstance(self.relax_collectives_on_preemption, bool):
            raise ConfigError(
                "FailureConfig.relax_collectives_on_preemption="
                f"{self.relax_collectives_on_preemption!r} must be True or False."
            )
        if not isinstance(self.warm_standby, bool):
            raise ConfigError(
                f"FailureConfig.warm_standby={self.warm_standby!r} must be True or False."
            )
        if not isinstance(self.keep_survivors, bool):
            raise ConfigError(
                f"FailureConfig.keep_survivors={self.keep_survivors!r} must be True or False."
            )
        check_positive_float("FailureConfig.stop_timeout_s", self.stop_timeout_s)
        check_field_types(self)
