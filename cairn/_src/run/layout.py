"""The layout of a run directory on storage (versioned).

``<storage>/<run>/`` holds:

* ``cairn_run.json``: the run index (committed checkpoints, attempts, failure budget);
* ``lease.json``: which driver owns the run right now;
* ``metrics/``: the metrics history, JSON-lines segments;
* ``events/``: the goodput event log, JSON-lines segments;
* one directory per checkpoint report, each committed by its manifest.
"""

from __future__ import annotations

import re

LAYOUT_VERSION = 1
INDEX_NAME = "cairn_run.json"
LEASE_NAME = "lease.json"
METRICS_DIR = "metrics"
EVENTS_DIR = "events"
RESERVED_NAMES = frozenset({INDEX_NAME, LEASE_NAME, METRICS_DIR, EVENTS_DIR})

_DEFAULT_DIR_NAME = re.compile(r"^checkpoint_\d{6,}$")
# A single path component that is safe on every backend: no separators, no leading dot
# (hidden files are skipped by some listings), nothing a shell or URL would mangle.
_SAFE_COMPONENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-=]{0,199}$")


def default_checkpoint_dir_name(report_index: int) -> str:
    return f"checkpoint_{report_index:06d}"


def is_default_checkpoint_dir_name(name: str) -> bool:
    return bool(_DEFAULT_DIR_NAME.match(name))


def is_safe_dir_name(name: str) -> bool:
    return bool(_SAFE_COMPONENT.match(name)) and name not in RESERVED_NAMES and ".." not in name
