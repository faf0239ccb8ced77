"""User-facing configuration dataclasses.

They follow Ray Train 2.x names and arguments. Every config is frozen and validates in
``__post_init__``: a bad value raises :class:`ConfigError` naming the field, the value
received and what is accepted, at the line where the config is built. The positional
arguments are Ray Train 2.60's, in Ray's order, up to the first one Cairn does not support;
the arguments only Cairn has are keyword-only (``ScalingConfig``: ``config/scaling.py``).
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field, fields
from typing import Any, Literal

from cairn._src import migration
from cairn._src.config.checks import check_int, left_out
from cairn._src.config.failure import FailureConfig
from cairn._src.config.scaling import ScalingConfig as ScalingConfig
from cairn._src.errors import ConfigDeprecationError, ConfigError
from cairn._src.field_types import check_field_types
from cairn._src.storage.location import uri_can_carry
from cairn._src.storage.options import StorageOptions
from cairn._src.storage.retry import RetryPolicy
from cairn._src.storage.tuning import TransferConfig
from cairn._src.storage.uris import dot_component, public_uri, scheme_of, strip_uri
from cairn._src.text import printable

# The hooks of cairn.Callback and cairn.UserCallback; a RunConfig callback must have one.
HOOK_NAMES = ("on_report", "on_checkpoint", "on_failure", "on_run_end", "after_report",
              "after_exception")


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
    def parse(cls, value: object) -> CheckpointUploadMode:
        if isinstance(value, cls):
            return value
        if isinstance(value, str) and value.upper() in cls.__members__:
            return cls[value.upper()]
        accepted = ", ".join(repr(m.value) for m in cls)
        raise ConfigError(f"checkpoint_upload_mode={value!r} is not one of {accepted}.")


UploadFailurePolicy = Literal["fail", "skip"]


@dataclass(frozen=True)
class CheckpointConfig:
    """Which checkpoints to keep, and how uploads behave.

    * ``num_to_keep``: keep the best N by ``checkpoint_score_attribute`` (or the latest N
      when no attribute is given). The latest committed checkpoint and the one the current
      attempt resumed from are always kept on top of those. ``None`` keeps everything.
    * ``max_pending_uploads``: ASYNC uploads in flight per worker before ``report()`` waits.
    * ``upload_failure_policy``: ``"fail"`` fails the attempt when an upload still fails
      after retries (it counts against ``FailureConfig.max_failures``); ``"skip"`` drops
      that checkpoint with a warning and training goes on.
    * ``delete_unmanaged_checkpoints``: retention deletes the data of checkpoints
      registered by reference (NO_UPLOAD, ``checkpoint_upload_fn``; inside the run
      directory or outside it) that this run recorded registering, instead of only
      forgetting them.
    * ``verify_on_resume``: what the driver checks of the checkpoint an attempt resumes
      from. ``"sizes"`` (the default): its manifest, and that every file is a regular file
      of the recorded size, without reading data; the workers verify checksums as they
      restore, and a checksum failure on any rank makes the next attempt verify that
      checkpoint fully and fall back from it on every rank. A checkpoint this driver
      committed itself is not re-checked at all. ``"full"``: every byte is read and
      checksummed on the driver before the workers start.
    * ``local_tier_bytes``: with remote storage, each node keeps a copy of the newest
      committed checkpoint, up to this many bytes per run, and a restarted worker on that
      node restores from it, verified against the manifest (``0``, the default: off).
    * ``local_tier_dir``: where that copy lives on each node (``None``:
      ``CAIRN_LOCAL_TIER_DIR``, else ``cairn-local-tier`` in the temp directory; a
      directory on ``/dev/shm`` keeps it in RAM).

    The positional arguments are Ray Train 2.60's, in its order: ``num_to_keep``,
    ``checkpoint_score_attribute``, ``checkpoint_score_order``, then the removed
    ``checkpoint_frequency`` and ``checkpoint_at_end`` (given, by position or by keyword:
    :class:`ConfigDeprecationError`, as Ray raises). The rest are Cairn's, keyword-only.
    """

    num_to_keep: int | None = None
    checkpoint_score_attribute: str | None = None
    checkpoint_score_order: Literal["max", "min"] = "max"
    checkpoint_frequency: Any = field(default=migration.DEPRECATED, repr=False, compare=False)
    checkpoint_at_end: Any = field(default=migration.DEPRECATED, repr=False, compare=False)
    _: KW_ONLY
    max_pending_uploads: int = 2
    upload_failure_policy: UploadFailurePolicy = "fail"
    delete_unmanaged_checkpoints: bool = False
    verify_on_resume: Literal["sizes", "full"] = "sizes"
    local_tier_bytes: int = 0
    local_tier_dir: str | None = None

    def __post_init__(self) -> None:
        for removed in ("checkpoint_frequency", "checkpoint_at_end"):
            if not left_out(getattr(self, removed)):
                raise ConfigDeprecationError(migration.checkpoint_config_message(removed))
        if self.num_to_keep is not None:
            try:
                check_int("CheckpointConfig.num_to_keep", self.num_to_keep, minimum=1)
            except ConfigError as exc:
                raise ConfigError(f"{str(exc).rstrip('.')}, or None to keep every checkpoint "
                                  f"(Ray Train: Received invalid num_to_keep: "
                                  f"{self.num_to_keep}.)") from None
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
                "is not one of 'max', 'min' (Ray Train: Received invalid "
                f"checkpoint_score_order: {self.checkpoint_score_order}.)"
            )
        check_int("CheckpointConfig.max_pending_uploads", self.max_pending_uploads, minimum=1)
        if self.verify_on_resume not in ("sizes", "full"):
            raise ConfigError(
                f"CheckpointConfig.verify_on_resume={self.verify_on_resume!r} is not one of "
                "'sizes' (the manifest and file sizes; workers verify checksums as they "
                "restore), 'full' (every byte checksummed on the driver)."
            )
        if self.upload_failure_policy not in ("fail", "skip"):
            raise ConfigError(
                f"CheckpointConfig.upload_failure_policy={self.upload_failure_policy!r} "
                "is not one of 'fail', 'skip'."
            )
        check_int("CheckpointConfig.local_tier_bytes", self.local_tier_bytes, minimum=0)
        if self.local_tier_dir is not None and not (
                isinstance(self.local_tier_dir, str) and os.path.isabs(self.local_tier_dir)):
            raise ConfigError(
                f"CheckpointConfig.local_tier_dir={self.local_tier_dir!r} must be an "
                "absolute path (the same on every node) or None."
            )
        check_field_types(self)


def default_storage_path() -> str:
    """``CAIRN_STORAGE_PATH``, else ``~/cairn_results`` (also when it is set but blank)."""
    from_env = os.environ.get("CAIRN_STORAGE_PATH", "")
    return from_env if from_env.strip() else os.path.expanduser("~/cairn_results")


@dataclass(frozen=True)
class RunConfig:
    """Where the run lives and how it behaves.

    ``name`` identifies the run inside ``storage_path``: calling ``fit()`` again with the
    same name and storage continues the run. ``storage_path`` is a local path or any URI
    Cairn can resolve (``s3://``, ``gs://``, a registered custom scheme ...);
    ``storage_filesystem`` is an explicit ``pyarrow.fs.FileSystem``, fsspec filesystem, or a
    zero-argument factory returning one (use a factory when the object cannot be pickled).

    ``storage_retry`` is the retry budget of every storage call of the run. ``startup_retry``
    is the driver's budget while it starts (taking the lease, reading the run index,
    settling what a dead driver left): ``None`` uses ``storage_retry``; give a longer one
    (``RetryPolicy(max_attempts=20, max_backoff_s=30)``) to ride out a storage outage at
    start. When it runs out, ``fit()`` raises :class:`StorageError` saying that the run is
    intact and can be started again. ``storage_transfer`` sets the part size and the
    requests in flight of this run's transfers with remote storage, in every worker and in
    the driver (:class:`cairn.storage.TransferConfig`; ``None``: each process's own
    settings, the defaults unless ``cairn.storage.set_transfer_config()`` changed them).
    It travels with the run in one ``StorageOptions`` (:meth:`storage_options`), never
    through a process-wide setting, so two ``fit()`` calls in one process never see each
    other's, and the driver's own setting never changes. ``storage_fsync`` (on by
    default) makes a commit durable on local and POSIX-mounted storage: every data file
    and its directories are fsynced before the manifest is written, and the manifest and
    the run index are fsynced before and after their rename, so a committed checkpoint
    survives a power loss. ``False`` skips the fsyncs, for tmpfs or scratch disks: a
    commit then survives a killed process but not a crashed machine (``docs/storage.md``).

    The positional arguments are Ray Train 2.60's, in its order: ``name``,
    ``storage_path``, ``storage_filesystem``, ``failure_config``, ``checkpoint_config``,
    ``callbacks``, ``worker_runtime_env``. The rest are keyword-only: Cairn's own, and Ray's
    removed ``sync_config``, ``verbose``, ``stop``, ``progress_reporter`` and
    ``log_to_file``, which come after ``logging_config`` (not supported) in Ray's order.
    ``callbacks`` is a list, as in Ray (``run_config.callbacks.append(cb)`` works; a
    callback appended after the config was built is not checked); it takes no part in the
    hash of a RunConfig, so a config without ``worker_env`` stays hashable.
    """

    name: str | None = None
    storage_path: str | os.PathLike[str] | None = None
    storage_filesystem: Any = None
    failure_config: FailureConfig = field(default_factory=FailureConfig)
    checkpoint_config: CheckpointConfig = field(default_factory=CheckpointConfig)
    callbacks: Sequence[Any] = field(default_factory=list, hash=False)
    # Ray Train's name: only its "env_vars" apply (merged into worker_env); workers run in
    # the driver's Python environment, so pip/conda/working_dir are refused.
    worker_runtime_env: dict[str, Any] | None = None
    # Ray's next argument, logging_config, is not supported: an 8th positional argument
    # is a TypeError rather than a value taken for one of Cairn's own fields.
    _: KW_ONLY
    storage_retry: RetryPolicy = field(default_factory=RetryPolicy)
    storage_transfer: TransferConfig | None = None
    storage_fsync: bool = True
    worker_env: dict[str, str] | None = None
    log_to_driver: bool = True
    startup_retry: RetryPolicy | None = None
    # The driver's live view: 0 off, 1 one status line, 2 also a line per event; None: the
    # CAIRN_PROGRESS environment variable, else 1.
    progress: int | None = None
    sync_config: Any = field(default=migration.DEPRECATED, repr=False, compare=False)
    verbose: Any = field(default=migration.DEPRECATED, repr=False, compare=False)
    stop: Any = field(default=migration.DEPRECATED, repr=False, compare=False)
    progress_reporter: Any = field(default=migration.DEPRECATED, repr=False, compare=False)
    log_to_file: Any = field(default=migration.DEPRECATED, repr=False, compare=False)

    def __post_init__(self) -> None:
        for removed in migration.RUN_CONFIG_REMOVED:
            if not left_out(getattr(self, removed)):
                raise ConfigDeprecationError(migration.run_config_message(removed))
        # Ray Train's RunConfig takes None for these and fills in the defaults.
        defaults = {"checkpoint_config": CheckpointConfig, "failure_config": FailureConfig,
                    "callbacks": list, "storage_retry": RetryPolicy}
        for name, default in defaults.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, default())
        if self.callbacks == ():  # as Ray's `callbacks or []`: a list to append to
            object.__setattr__(self, "callbacks", [])
        if self.name is not None:
            if not isinstance(self.name, str) or not self.name:
                raise ConfigError(f"RunConfig.name={self.name!r} must be a non-empty string.")
            if "/" in self.name or "\\" in self.name or self.name in (".", ".."):
                raise ConfigError(
                    f"RunConfig.name={self.name!r} must be a single path component "
                    "(no '/', '\\', '.' or '..').")
            if "\0" in self.name or not _encodable(self.name):
                raise ConfigError(f"RunConfig.name={self.name!r} must be a str without NUL "
                                  "characters (or lone surrogates): it names a directory.")
            if len(os.fsencode(self.name)) > 255:
                raise ConfigError(
                    f"RunConfig.name={self.name!r} is {len(os.fsencode(self.name))} bytes "
                    "long; it names the run's directory, which can be at most 255 bytes.")
            # As checkpoint_dir_name: a terminal obeys control characters, a newline forges logs.
            control = next((char for char in self.name if printable(char) != char), None)
            if control is not None or not self.name.strip():
                held = (f"holds the control character {control!a}" if control is not None
                        else "is only whitespace, which `cairn ls` shows as a blank name")
                raise ConfigError(f"RunConfig.name={self.name!r} {held}; use printable "
                                  "characters (no U+0000-U+001F, U+007F-U+009F), at least "
                                  "one of them not whitespace.")
        if self.storage_path is not None and not isinstance(self.storage_path, (str, os.PathLike)):
            raise ConfigError(
                f"RunConfig.storage_path={self.storage_path!r} must be a path or URI string.")
        if self.storage_path is not None and "\0" in os.fsdecode(self.storage_path):
            raise ConfigError(f"RunConfig.storage_path={_public(self.storage_path)!r} must be "
                              "a path or URI without NUL characters.")
        if self.storage_path is not None and not os.fspath(self.storage_path):
            raise ConfigError(
                f"RunConfig.storage_path={self.storage_path!r} is empty; pass a directory or "
                "a URI such as 's3://bucket/runs', or leave it out (None) for the default "
                "(the CAIRN_STORAGE_PATH environment variable, else ~/cairn_results).")
        if self.storage_filesystem is None and isinstance(self.storage_path, str):
            _check_storage_uri(self.storage_path, self.name)
        if not isinstance(self.checkpoint_config, CheckpointConfig):
            raise ConfigError(
                f"RunConfig.checkpoint_config={self.checkpoint_config!r} must be a "
                "CheckpointConfig.")
        if self.startup_retry is not None and not isinstance(self.startup_retry, RetryPolicy):
            raise ConfigError(
                f"RunConfig.startup_retry={self.startup_retry!r} must be a cairn.RetryPolicy "
                "or None (None: the start-up uses storage_retry).")
        if not isinstance(self.failure_config, FailureConfig):
            raise ConfigError(f"RunConfig.failure_config={self.failure_config!r} must be a "
                              "FailureConfig.")
        if self.progress is not None and (type(self.progress) is not int
                                          or self.progress not in (0, 1, 2)):
            raise ConfigError(
                f"RunConfig.progress={self.progress!r} must be 0 (no live view), 1 (a status "
                "line), 2 (a status line and a line per event) or None (the CAIRN_PROGRESS "
                "environment variable, else 1).")
        if isinstance(self.callbacks, (str, bytes)) or not isinstance(self.callbacks, Sequence):
            raise ConfigError(
                f"RunConfig.callbacks={self.callbacks!r} must be a list of cairn.Callback or "
                "cairn.UserCallback objects.")
        for callback in self.callbacks:
            if isinstance(callback, type):
                raise ConfigError(
                    f"RunConfig.callbacks contains the class {callback.__qualname__}, not an "
                    f"instance of it: pass {callback.__qualname__}() instead.")
            if not any(callable(getattr(callback, hook, None)) for hook in HOOK_NAMES):
                raise ConfigError(
                    f"RunConfig.callbacks contains {callback!r}, which has none of the "
                    f"callback hooks ({', '.join(HOOK_NAMES)}): pass cairn.Callback or "
                    "cairn.UserCallback subclasses (Ray Tune callbacks do not apply).")
        if not isinstance(self.storage_retry, RetryPolicy):
            raise ConfigError(f"RunConfig.storage_retry={self.storage_retry!r} must be a "
                              "RetryPolicy.")
        if self.storage_transfer is not None and not isinstance(self.storage_transfer,
                                                                TransferConfig):
            raise ConfigError(
                f"RunConfig.storage_transfer={self.storage_transfer!r} must be a "
                "cairn.storage.TransferConfig or None (None: the process's settings).")
        if not isinstance(self.storage_fsync, bool):
            raise ConfigError(
                f"RunConfig.storage_fsync={self.storage_fsync!r} must be True (the default: "
                "commits are durable, data and manifests fsynced) or False (tmpfs or scratch "
                "storage: no fsync).")
        check_field_types(self)
        if self.worker_env is not None:
            # Checked here, not when a worker's process starts (after an attempt counted).
            object.__setattr__(self, "worker_env",
                               checked_env(self.worker_env, "RunConfig.worker_env"))
        self._merge_worker_runtime_env()

    def __repr__(self) -> str:
        # No secret from a URI in a repr (a user info with a password, a secret_key=
        # parameter): storage_path shows as every message shows it.
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.repr}
        values["storage_path"] = _public(self.storage_path)
        return "RunConfig(" + ", ".join(f"{k}={v!r}" for k, v in values.items()) + ")"

    def storage_options(self) -> StorageOptions:
        """This run's transfer settings and retry budget, as the one object the driver
        passes to what transfers (each worker builds the same from its ``SetupMessage``)."""
        return StorageOptions(transfer=self.storage_transfer, retry=self.storage_retry,
                              fsync=self.storage_fsync)

    def _merge_worker_runtime_env(self) -> None:
        runtime_env = self.worker_runtime_env
        if runtime_env is None:
            return
        if not isinstance(runtime_env, Mapping):
            raise ConfigError(
                f"RunConfig.worker_runtime_env={runtime_env!r} must be a dict such as "
                "{'env_vars': {'NAME': 'value'}}, or None."
            )
        unsupported = sorted(str(key) for key in runtime_env if key != "env_vars")
        if unsupported:
            raise ConfigError(
                f"RunConfig.worker_runtime_env has {unsupported}; Cairn supports only "
                "'env_vars' there: workers run in the driver's Python environment and working "
                "directory, so install packages (pip, conda, py_modules) and ship code "
                "(working_dir) on every node beforehand."
            )
        env_vars = runtime_env.get("env_vars") or {}
        if not isinstance(env_vars, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env_vars.items()
        ):
            raise ConfigError(
                f"RunConfig.worker_runtime_env['env_vars']={env_vars!r} must be a dict of "
                "str to str."
            )
        merged = checked_env(env_vars, "RunConfig.worker_runtime_env['env_vars']")
        for name, value in (self.worker_env or {}).items():
            if merged.get(name, value) != value:
                raise ConfigError(
                    f"RunConfig.worker_env[{name!r}]={value!r} and "
                    f"worker_runtime_env['env_vars'][{name!r}]={merged[name]!r} disagree; "
                    "set the variable in one of them."
                )
            merged[name] = value
        object.__setattr__(self, "worker_env", merged)


def _public(path: str | os.PathLike[str] | None) -> str | os.PathLike[str] | None:
    """``RunConfig.storage_path`` as a repr or a message may show it: a URI without its
    credentials."""
    return public_uri(path) if isinstance(path, str) else path


def _check_storage_uri(storage_path: str, name: str | None) -> None:
    """Refuse a remote ``storage_path`` URI with a ``.`` or ``..`` path component, and a run
    ``name`` that no URI below it can carry (:func:`uri_can_carry`)."""
    scheme = scheme_of(storage_path)
    if scheme in (None, "file"):
        return  # the local disk: '.' and '..' resolve, and its URIs carry any name
    dot = dot_component(strip_uri(storage_path))
    if dot is not None and scheme != "local":  # fsspec's local:// is the disk too
        raise ConfigError(
            f"RunConfig.storage_path={_public(storage_path)!r} has the path component "
            f"{dot!r}: remote storage does not resolve it as a local disk does, and each "
            "fit() could write over the run's metrics history and event log. Accepted: a URI "
            "without '.' and '..' components, such as 's3://bucket/team/runs'.")
    if name is not None and not uri_can_carry(scheme, name):
        held = next(char for char in name if char in "?#")
        raise ConfigError(
            f"RunConfig.name={name!r} holds {held!r}, which ends the path of a {scheme}:// "
            "URI (Cairn does not percent-encode paths of registered schemes and fsspec "
            "protocols): Result.uri and Checkpoint.uri would name another run. Accepted "
            f"with {scheme}:// storage: a name without '?' and '#'.")


def checked_env(env: object, where: str) -> dict[str, str]:
    """``env`` as a dict, when it is environment variables a worker's process can be given
    (what ``os.environ`` and ``subprocess`` accept: str names, not empty, without ``=`` or
    NUL, str values without NUL, both encodable as file names); else :class:`ConfigError`
    naming ``where``, the variable and what is accepted, at the line that built the config,
    not in a worker after an attempt was counted."""
    if not isinstance(env, Mapping):
        raise ConfigError(f"{where}={env!r} must be a dict of variable names to str values, "
                          "such as {'OMP_NUM_THREADS': '4'}, or None.")
    for name, value in env.items():
        if (not isinstance(name, str) or not name or "=" in name or "\0" in name
                or not _encodable(name)):
            kind = "" if isinstance(name, str) else f" (not {type(name).__name__})"
            raise ConfigError(
                f"{where}[{name!r}]={value!r}: a variable's name must be a non-empty str"
                f"{kind} without '=' or NUL characters (the environment holds NAME=value "
                "entries), such as 'OMP_NUM_THREADS'.")
        if not isinstance(value, str):
            hint = (f": {str(value)!r}" if isinstance(value, (int, float))
                    and not isinstance(value, bool) else "")
            raise ConfigError(f"{where}[{name!r}]={value!r} must be a str (environment "
                              f"variables are strings{hint}).")
        if "\0" in value or not _encodable(value):
            raise ConfigError(f"{where}[{name!r}]={value!r} must be a str without NUL "
                              "characters (or lone surrogates) that the environment can hold.")
    return dict(env)


def _encodable(text: str) -> bool:
    try:
        os.fsencode(text)
    except UnicodeError:
        return False
    return True
