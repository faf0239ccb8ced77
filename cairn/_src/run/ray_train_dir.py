"""A run directory that Ray Train wrote, refused before a Cairn run starts in it.

A user porting a script from Ray Train mid-training keeps its ``RunConfig(name=...,
storage_path=...)``, which names the directory Ray Train wrote. Cairn cannot resume Ray
Train's checkpoints in place (no manifests, no run index), and a new Cairn run there would
start from scratch beside them. So ``fit()`` lists the run directory once, before it
writes anything, and refuses a directory holding a file only Ray Train writes at the top
of a run directory:

* Ray Train 2 (``RAY_TRAIN_V2_ENABLED=1``, the default in Ray 2.60):
  ``checkpoint_manager_snapshot.json``, beside ``checkpoint_<timestamp>`` directories (Ray
  resumes a run when it finds this file);
* Ray Train 1, through Ray Tune: ``tuner.pkl``, ``trainer.pkl``,
  ``experiment_state-<timestamp>.json`` and ``basic-variant-state-<timestamp>.json``,
  beside the trial directory that holds ``checkpoint_<n>`` directories.

Ray's ``.validate_storage_marker`` alone (left by a Ray run that stopped before its first
checkpoint, or by its storage check) holds no progress, and is not refused. A directory
holding any of Cairn's own entries (its index, lease, logs, anything named ``_cairn...``)
is Cairn's run, whatever else it holds: a user's checkpoint may be named ``tuner.pkl``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

from cairn._src.errors import CairnError, ConfigError
from cairn._src.run.layout import has_safe_characters, is_reserved_name
from cairn._src.storage.fileio import list_dir_names, read_bytes
from cairn._src.storage.location import StorageLocation
from cairn._src.storage.retry import RetryPolicy

SNAPSHOT_NAME = "checkpoint_manager_snapshot.json"
# A larger snapshot is read as none: the message then names no checkpoint.
_MAX_SNAPSHOT_BYTES = 16 << 20
# In the order a message names the one it found: the most telling first.
_RAY_FILES = (SNAPSHOT_NAME, "tuner.pkl", "trainer.pkl")
_RAY_STATE_FILE = re.compile(r"(experiment_state|basic-variant-state)-[\w.:-]+\.json")


def ray_train_marker(names: Iterable[str]) -> str | None:
    """The entry of a run directory's listing ``names`` that shows Ray Train wrote it, or
    None: when none does, or when the listing holds any of Cairn's own entries."""
    listed = set(names)
    if any(is_reserved_name(name) for name in listed):
        return None
    for name in _RAY_FILES:
        if name in listed:
            return name
    return min((name for name in listed if _RAY_STATE_FILE.fullmatch(name)), default=None)


def refuse_ray_train_run(run: StorageLocation, retry: RetryPolicy, *, name: str) -> None:
    """Raise :class:`ConfigError` when the run directory ``run`` (of ``RunConfig(name=
    name)``) holds a Ray Train run and no Cairn run; one listing of ``run``, and reads
    nothing else unless it refuses. A missing directory is a new run. Storage errors are
    raised as the listing raises them."""
    names = list_dir_names(run, retry)
    marker = ray_train_marker(names)
    if marker is None:
        return
    latest = _latest_ray_checkpoint(run, retry, names) if marker == SNAPSHOT_NAME else None
    if latest is not None:
        start = (f"To start the Cairn run from Ray Train's latest checkpoint, pass its path "
                 f"({latest.display()}) in train_loop_config")
    else:
        start = ("To start the Cairn run from a checkpoint Ray Train wrote there (Ray Train "
                 "1 keeps them in the trial directory inside it), pass its path in "
                 "train_loop_config")
    raise ConfigError(
        f"RunConfig(name={name!r}) with this storage_path names the run directory "
        f"{run.display()}, which holds a Ray Train run ({marker}, which Ray Train writes), "
        "not a Cairn run. Cairn cannot resume Ray Train's checkpoints in place, and a new "
        "run there would start from scratch beside them; nothing was written. Give the "
        "Cairn run another RunConfig(name=...) or storage_path. "
        f"{start} and, in the train function, load it with "
        "cairn.Checkpoint(path).as_directory() when cairn.get_checkpoint() returns None "
        "(later restarts resume from the run's own checkpoints)."
    )


def _latest_ray_checkpoint(run: StorageLocation, retry: RetryPolicy,
                           names: list[str]) -> StorageLocation | None:
    """The checkpoint directory Ray Train 2's snapshot names as its latest, when the
    snapshot reads and names a directory of the listing; None otherwise (the message then
    names none)."""
    try:
        body = json.loads(read_bytes(run.join(SNAPSHOT_NAME), retry,
                                     limit=_MAX_SNAPSHOT_BYTES))
        latest = body["latest_checkpoint_result"]["checkpoint_dir_name"]
    except (CairnError, OSError, ValueError, RecursionError, TypeError, KeyError):
        return None
    if isinstance(latest, str) and has_safe_characters(latest) and latest in names:
        return run.join(latest)
    return None
