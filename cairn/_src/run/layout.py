"""The layout of a run directory on storage (versioned), and the names it reserves.

``<storage>/<run>/`` holds:

* ``cairn_run.json``: the run index (committed checkpoints, attempts, failure budget);
* ``lease.json``: which driver owns the run right now;
* ``metrics/``: the metrics history, JSON-lines segments;
* ``events/``: the goodput event log, JSON-lines segments;
* one directory per checkpoint report, each committed by its manifest
  (``_cairn_manifest.json``); default names are ``checkpoint_<report index, 6 digits>``;
* briefly, temporary files of atomic writes (names containing ``.cairn-tmp-``).

A checkpoint name a user chooses may collide with none of these: not a reserved name (in
any letter case, since some file systems ignore case), nothing starting with ``_cairn``
(names Cairn may add later), no temporary-file mark, and not a default name, which a later
report could need.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

from cairn._src.storage.fileio import TEMPORARY_MARK

LAYOUT_VERSION = 1
INDEX_NAME = "cairn_run.json"
LEASE_NAME = "lease.json"
METRICS_DIR = "metrics"
EVENTS_DIR = "events"
MANIFEST_NAME = "_cairn_manifest.json"
RESERVED_NAMES = frozenset({INDEX_NAME, LEASE_NAME, METRICS_DIR, EVENTS_DIR, MANIFEST_NAME})
RESERVED_PREFIX = "_cairn"
_RESERVED_FOLDED = frozenset(name.casefold() for name in RESERVED_NAMES)

_DEFAULT_DIR_NAME = re.compile(r"checkpoint_\d{6,}")
_DEFAULT_DIR_NAME_FOLDED = re.compile(r"checkpoint_\d{6,}", re.IGNORECASE)
# A single path component that is safe on every backend: no separators, no leading dot
# (hidden files are skipped by some listings), nothing a shell or URL would mangle.
# Matched with fullmatch: '$' would also match before a trailing newline.
_SAFE_COMPONENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-=]{0,199}")
_MAX_STORED_NAME_BYTES = 255


def default_checkpoint_dir_name(report_index: int) -> str:
    return f"checkpoint_{report_index:06d}"


def is_default_checkpoint_dir_name(name: str) -> bool:
    """Whether ``name`` is a name Cairn gives checkpoints itself (``checkpoint_000003``)."""
    return bool(_DEFAULT_DIR_NAME.fullmatch(name))


def looks_like_default_dir_name(name: str) -> bool:
    """Whether ``name`` is, in any letter case, a name Cairn gives checkpoints itself."""
    return bool(_DEFAULT_DIR_NAME_FOLDED.fullmatch(name))


def is_reserved_name(name: str) -> bool:
    """Whether ``name`` is, or could be mistaken for, one of Cairn's own entries."""
    return (
        name.casefold() in _RESERVED_FOLDED
        or name.casefold().startswith(RESERVED_PREFIX)
        or TEMPORARY_MARK in name
    )


def has_safe_characters(name: str) -> bool:
    """Whether ``name`` is one short path component of letters, digits and ``_.-=``."""
    return bool(_SAFE_COMPONENT.fullmatch(name)) and ".." not in name


def is_safe_dir_name(name: str) -> bool:
    """Whether a user may choose ``name`` for a checkpoint (default names aside)."""
    return has_safe_characters(name) and not is_reserved_name(name)


def is_stored_dir_name(name: str) -> bool:
    """Whether ``name``, read back from an index or a log, can name a checkpoint directory.

    Looser than :func:`is_safe_dir_name` (older versions accepted more), but never a path
    that leaves the run directory or one of Cairn's own entries, nor one no storage can
    name: JSON may spell a lone surrogate (``"\\udc80"``), which has no UTF-8 form, and a
    backend given it raises ``UnicodeEncodeError`` instead of a storage error.
    """
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        return False
    return (
        bool(name)
        and name not in (".", "..")
        and not any(ch in name for ch in "/\\\x00")
        and size <= _MAX_STORED_NAME_BYTES
        and name not in RESERVED_NAMES
        and TEMPORARY_MARK not in name
    )


def nearest_marked(directory: str, names: Sequence[str]) -> tuple[str, str] | None:
    """The nearest of the local ``directory`` and its parents that holds an entry named
    one of ``names`` (tried in that order at each level), with that name; None when none
    does. A run directory holds :data:`INDEX_NAME`, a committed checkpoint
    :data:`MANIFEST_NAME`."""
    while True:
        for name in names:
            if os.path.lexists(os.path.join(directory, name)):
                return directory, name
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent
