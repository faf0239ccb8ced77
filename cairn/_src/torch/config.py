"""``TorchConfig``: how ``TorchTrainer`` sets up ``torch.distributed`` in every worker."""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass

from cairn._src.errors import ConfigError
from cairn._src.field_types import check_field_types

BACKENDS = ("gloo", "nccl")
"""``torch.distributed`` backends ``TorchConfig(backend=...)`` accepts."""

MAX_TIMEOUT_S = 1e9
"""The largest ``TorchConfig(timeout_s=...)``, about 31 years. torch keeps a process
group's deadline as nanoseconds in a signed 64-bit integer (now plus the timeout), so a
timeout past about 9.2e9 s fails the rendezvous at once, and one past what
``datetime.timedelta`` takes (about 8.6e13 s; ``inf``) raises ``OverflowError``."""


@dataclass(frozen=True)
class TorchConfig:
    """The ``torch.distributed`` set-up of a :class:`~cairn.torch.TorchTrainer` run.

    * ``backend``: ``"gloo"`` or ``"nccl"``; ``None`` (the default) picks ``"nccl"`` when
      ``ScalingConfig(use_gpu=True)`` and CUDA is available in the worker, ``"gloo"``
      otherwise. ``"nccl"`` without CUDA fails in the worker with a :class:`ConfigError`.
      It is also the one positional argument, as in Ray Train (``TorchConfig("gloo")``).
    * ``timeout_s``: the timeout of the process group's collectives and of its
      rendezvous, in seconds (``torch.distributed.init_process_group(timeout=...)``),
      a number > 0 and at most ``1e9`` (keyword only: Ray's second argument is
      ``init_method``, which Cairn does not take).
      It only bounds a hang that Cairn cannot see: when a worker dies, Cairn kills the
      whole group at once and restarts it, whatever this timeout is.
    """

    backend: str | None = None
    _: KW_ONLY
    timeout_s: float = 1800.0

    def __post_init__(self) -> None:
        if self.backend is not None and self.backend not in BACKENDS:
            raise ConfigError(
                f"TorchConfig.backend={self.backend!r} is not one of "
                + ", ".join(repr(b) for b in BACKENDS)
                + " or None (pick nccl on GPUs, gloo otherwise)."
            )
        if (
            isinstance(self.timeout_s, bool)
            or not isinstance(self.timeout_s, (int, float))
            or not (0 < self.timeout_s <= MAX_TIMEOUT_S)
        ):
            raise ConfigError(
                f"TorchConfig.timeout_s={self.timeout_s!r} must be a number > 0 and <= 1e9 "
                "(seconds, about 31 years: the longest timeout torch's process group can "
                "count down; pass 1e9 for no practical limit)."
            )
        check_field_types(self)
