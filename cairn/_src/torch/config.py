"""``TorchConfig``: how ``TorchTrainer`` sets up ``torch.distributed`` in every worker."""

from __future__ import annotations

from dataclasses import dataclass

from cairn._src.errors import ConfigError
from cairn._src.field_types import check_field_types

BACKENDS = ("gloo", "nccl")
"""``torch.distributed`` backends ``TorchConfig(backend=...)`` accepts."""


@dataclass(frozen=True, kw_only=True)
class TorchConfig:
    """The ``torch.distributed`` set-up of a :class:`~cairn.torch.TorchTrainer` run.

    * ``backend``: ``"gloo"`` or ``"nccl"``; ``None`` (the default) picks ``"nccl"`` when
      ``ScalingConfig(use_gpu=True)`` and CUDA is available in the worker, ``"gloo"``
      otherwise. ``"nccl"`` without CUDA fails in the worker with a :class:`ConfigError`.
    * ``timeout_s``: the timeout of the process group's collectives and of its
      rendezvous, in seconds (``torch.distributed.init_process_group(timeout=...)``).
      It only bounds a hang that Cairn cannot see: when a worker dies, Cairn kills the
      whole group at once and restarts it, whatever this timeout is.
    """

    backend: str | None = None
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
            or not self.timeout_s > 0
        ):
            raise ConfigError(
                f"TorchConfig.timeout_s={self.timeout_s!r} must be a number > 0 (seconds)."
            )
        check_field_types(self)
