"""What every ``cairn`` subcommand shares: the retry budget and opening a run."""

from __future__ import annotations

import json
import math
from typing import Any

from cairn._src.checkpoint.index import RunIndex, read_index
from cairn._src.errors import CairnError, ManifestError
from cairn._src.run.layout import LEASE_NAME
from cairn._src.run.lease import LeaseInfo, is_live
from cairn._src.storage.fileio import read_bytes
from cairn._src.storage.location import StorageLocation, resolve
from cairn._src.storage.retry import RetryPolicy

RETRY = RetryPolicy()


def open_run(path: str) -> tuple[StorageLocation, RunIndex]:
    run = resolve(path)
    index = read_index(run, RETRY)
    if index is None:
        raise CairnError(f"{run.display()} is not a Cairn run directory (no run index).")
    return run, index


def live_lease(run: StorageLocation) -> LeaseInfo | None:
    try:
        lease = LeaseInfo.from_json(read_bytes(run.join(LEASE_NAME), RETRY))
    except (FileNotFoundError, ManifestError):
        # An invalid lease holds nothing: a driver takes it over too.
        return None
    return lease if is_live(lease) else None


def format_metrics(metrics: dict[str, Any], limit: int = 60) -> str:
    text = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in metrics.items())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float (a diverged loss) as None: strict JSON readers
    (``jq``, JavaScript) refuse ``NaN`` and ``Infinity``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def print_json(document: Any) -> None:
    """Print ``document`` as the strict JSON every ``--json`` writes (see docs/cli.md)."""
    print(json.dumps(json_safe(document), indent=1, allow_nan=False))
