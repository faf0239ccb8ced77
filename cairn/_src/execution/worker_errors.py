"""Worker failures, grouped by rank for one readable error."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerFailure:
    rank: int
    summary: str
    traceback: str
    exception: bytes | None = None


def group_failures(failures: list[WorkerFailure]) -> str:
    """One message: ranks with the same error share one entry ("[ranks 0, 2] ...").

    The first line summarizes; each group follows with its traceback, when there is one.
    """
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for failure in failures:
        groups[(failure.summary, failure.traceback)].append(failure.rank)
    parts = []
    for (summary, traceback), ranks in sorted(groups.items(), key=lambda g: min(g[1])):
        ordered = sorted(set(ranks))
        label = "rank" if len(ordered) == 1 else "ranks"
        head = f"[{label} {', '.join(str(r) for r in ordered)}] {summary}"
        parts.append(head + (f"\n{traceback.rstrip()}" if traceback else ""))
    if len(parts) <= 1:
        return parts[0] if parts else "unknown failure"
    first = parts[0].splitlines()[0]
    more = f" (and {len(parts) - 1} more)"
    return f"{first}{more}\n\n" + "\n\n".join(parts)
