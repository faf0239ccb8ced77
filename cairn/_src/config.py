"""User-facing configuration dataclasses.

They follow Ray Train 2.x names and arguments. Every config is frozen and keyword-only and
validates in ``__post_init__``: a bad value raises :class:`ConfigError` naming the field,
the value received and what is accepted, at the line where the config is built.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from cairn._src.errors import ConfigError
from cairn._src.storage.retry import RetryPolicy


class CheckpointUploadMode(enum.Enum):
    """How ``report()`` gets a checkpoint onto storage.

    * ``SYNC``: upload, commit, then return.
    * ``ASYNC``: return at once with a handle; upload and commit on a background thread.
    * ``NO_UPLOAD``: the checkpoint already lives on storage; record it by reference.
    """

    SYNC = "SYNC"
    ASYNC = "ASYNC"
    NO_UPLOAD = "NO_UPLOAD"

    @classmethod
    def parse(
        cls, value: object, *, argument: str = "checkpoint_upload_mode"
    ) -> CheckpointUploadMode:
        if isinstance(value, cls):
            return value
        if isinstance(value, str) and value.upper() in cls.__members__:
            return cls[value.upper()]
        accepted = ", ".join(repr(m.value) for m in cls)
        raise ConfigError(f"{argument}={value!r} is not one of {accepted}.")


def _check_int(name: str, value: object, *, minimum: int, allow: Sequence[int] = ()) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name}={value!r} must be an integer >= {minimum}.")
    if value < minimum and value not in allow:
        extra = "".join(f" or {a}" for a in allow)
        raise ConfigError(f"{name}={value!r} must be an integer >= {minimum}{extra}.")


def _check_positive_float(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ConfigError(f"{name}={value!r} must be a number > 0 (seconds).")


BACKENDS = ("local", "ray")


@dataclass(frozen=True, kw_only=True)
class ScalingConfig:
    """How many workers to run, and where.

    ``backend`` picks who starts the worker processes: ``"local"`` (processes on this
    machine, the default) or ``"ray"`` (actors on a Ray cluster).
    """

    num_workers: int = 1
    use_gpu: bool = False
    resources_per_worker: dict[str, float] | None = None
    placement_strategy: str = "PACK"
    backend: str = "local"

    def __post_init__(self) -> None:
        _check_int("ScalingConfig.num_workers", self.num_workers, minimum=1)
        if self.backend not in BACKENDS:
            raise ConfigError(
                f"ScalingConfig.backend={self.backend!r} is not one of "
                + ", ".join(repr(b) for b in BACKENDS)
                + "."
            )
        strategies = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
        if self.placement_strategy not in strategies:
            raise ConfigError(
                f"ScalingConfig.placement_strategy={self.placement_strategy!r} is not one of "
                + ", ".join(repr(s) for s in strategies)
                + "."
            )


UploadFailurePolicy = Literal["fail", "skip"]


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """Which checkpoints to keep, and how uploads behave.

    * ``num_to_keep``: keep the best N by ``checkpoint_score_attribute`` (or the latest N
      when no attribute is given). The latest committed checkpoint and the one the current
      attempt resumed from are always kept on top of those. ``None`` keeps everything.
    * ``max_pending_uploads``: ASYNC uploads in flight per worker before ``report()`` waits.
    * ``upload_failure_policy``: ``"fail"`` fails the attempt when an upload still fails
      after retries (it counts against ``FailureConfig.max_failures``); ``"skip"`` drops
      that checkpoint with a warning and training goes on.
    * ``delete_unmanaged_checkpoints``: retention deletes NO_UPLOAD checkpoints that live
      outside the run directory instead of only forgetting them.
    """

    num_to_keep: int | None = None
    checkpoint_score_attribute: str | None = None
    checkpoint_score_order: Literal["max", "min"] = "max"
    max_pending_uploads: int = 2
    upload_failure_policy: UploadFailurePolicy = "fail"
    delete_unmanaged_checkpoints: bool = False

    def __post_init__(self) -> None:
        if self.num_to_keep is not None:
            _check_int("CheckpointConfig.num_to_keep", self.num_to_keep, minimum=1)
        if self.checkpoint_score_attribute is not None and not (
            isinstance(self.checkpoint_score_attribute, str) and self.checkpoint_score_attribute
        ):
            raise ConfigError(
                "CheckpointConfig.checkpoint_score_attribute="
                f"{self.checkpoint_score_attribute!r} must be a non-empty string or None."
            )
        if self.checkpoint_score_order not in ("max", "min"):
            raise ConfigError(
                f"CheckpointConfig.checkpoint_score_order={self.checkpoint_score_order!r} "
                "is not one of 'max', 'min'."
            )
        _check_int("CheckpointConfig.max_pending_uploads", self.max_pending_uploads, minimum=1)
        if self.upload_failure_policy not in ("fail", "skip"):
            raise ConfigError(
                f"CheckpointConfig.upload_failure_policy={self.upload_failure_policy!r} "
                "is not one of 'fail', 'skip'."
            )


@dataclass(frozen=True, kw_only=True)
class FailureConfig:
    """What to do when a worker fails.

    * ``max_failures``: how many times the worker group is restarted (``-1``: no limit,
      ``0``: fail on the first failure).
    * ``collective_timeout_s``: how long the controller waits for every rank to reach a
      checkpoint report once one rank has, before failing with an error naming the ranks
      that did not arrive.
    """

    max_failures: int = 0
    collective_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        _check_int("FailureConfig.max_failures", self.max_failures, minimum=0, allow=(-1,))
        _check_positive_float("FailureConfig.collective_timeout_s", self.collective_timeout_s)


def default_storage_path() -> str:
    return os.environ.get("CAIRN_STORAGE_PATH", os.path.expanduser("~/cairn_results"))


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Where the run lives and how it behaves.

    ``name`` identifies the run inside ``storage_path``: calling ``fit()`` again with the
    same name and storage continues the run. ``storage_path`` is a local path or any URI
    Cairn can resolve (``s3://``, ``gs://``, a registered custom scheme ...);
    ``storage_filesystem`` is an explicit ``pyarrow.fs.FileSystem``, fsspec filesystem, or a
    zero-argument factory returning one (use a factory when the object cannot be pickled).
    """

    name: str | None = None
    storage_path: str | os.PathLike[str] | None = None
    storage_filesystem: Any = None
    checkpoint_config: CheckpointConfig = field(default_factory=CheckpointConfig)
    failure_config: FailureConfig = field(default_factory=FailureConfig)
    callbacks: Sequence[Any] = ()
    storage_retry: RetryPolicy = field(default_factory=RetryPolicy)
    worker_env: dict[str, str] | None = None
    log_to_driver: bool = True

    def __post_init__(self) -> None:
        if self.name is not None:
            if not isinstance(self.name, str) or not self.name:
                raise ConfigError(f"RunConfig.name={self.name!r} must be a non-empty string.")
            if "/" in self.name or "\\" in self.name or self.name in (".", ".."):
                raise ConfigError(
                    f"RunConfig.name={self.name!r} must be a single path component "
                    "(no '/', '\\', '.' or '..')."
                )
        if self.storage_path is not None and not isinstance(self.storage_path, (str, os.PathLike)):
            raise ConfigError(
                f"RunConfig.storage_path={self.storage_path!r} must be a path or URI string."
            )
        if not isinstance(self.checkpoint_config, CheckpointConfig):
            raise ConfigError(
                f"RunConfig.checkpoint_config={self.checkpoint_config!r} must be a "
                "CheckpointConfig."
            )
        if not isinstance(self.failure_config, FailureConfig):
            raise ConfigError(
                f"RunConfig.failure_config={self.failure_config!r} must be a FailureConfig."
            )
        if isinstance(self.callbacks, (str, bytes)) or not isinstance(self.callbacks,
                                                                       Sequence):
            raise ConfigError(
                f"RunConfig.callbacks={self.callbacks!r} must be a list of cairn.Callback."
            )
        if not isinstance(self.storage_retry, RetryPolicy):
            raise ConfigError(
                f"RunConfig.storage_retry={self.storage_retry!r} must be a RetryPolicy."
            )

