"""Worker failures, grouped by rank for one readable error, the cause first.

When one rank dies (a signal, ``os._exit``, the OOM killer), the others usually fail a
moment later inside a collective ("Connection closed by peer", "Connection reset"). Those
are consequences: the headline, the grouped text and the event log name the causes first
(:func:`cause_order`: ranks that died, ranks that failed with their own error, by rank),
then the ranks whose error looks like a lost peer.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from cairn._src.backends.protocol import WorkerHandle
from cairn._src.storage.uris import redact_text

# Errors a rank raises when a peer of a collective is gone (gloo, NCCL, sockets).
_LOST_PEER = re.compile(
    r"connection (reset|closed|refused|aborted)|closed by peer|broken pipe|"
    r"\bgloo\b.*(read|write|recv|send)|nccl.*(error|abort|timeout)|socket timeout|"
    r"ProcessGroup.*(abort|error)",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class WorkerFailure:
    rank: int
    summary: str
    traceback: str
    exception: bytes | None = None
    # Where it failed: {"file", "line", "function"} (code_locations.failing_frame), or None.
    frame: dict[str, Any] | None = None
    # The rank went without an error of its own: its process exited or was killed, or its
    # connection to the controller ended (whichever the controller saw first).
    went: bool = False


def describe_lost(worker: WorkerHandle, exited: bool) -> WorkerFailure:
    """A worker's connection closed without Done: how its process ended, when its exit
    was seen (``exited``); that it closed its connection otherwise."""
    summary = (exit_summary(worker) if exited else
               f"Worker rank {worker.rank} (pid {worker.pid}) closed its connection to the "
               "controller")
    return WorkerFailure(rank=worker.rank, traceback="", went=True, summary=summary)


def exit_summary(worker: WorkerHandle) -> str:
    return f"Worker rank {worker.rank} (pid {worker.pid}) {worker.describe_exit()}"


def cause_order(failure: WorkerFailure) -> int:
    """0: a cause (the process died or vanished, or the train function raised its own
    error); 1: an error that looks like the consequence of a peer's death (a collective
    that lost its peer)."""
    if failure.exception is None and not failure.traceback:
        return 0
    if _LOST_PEER.search(failure.summary) or _LOST_PEER.search(failure.traceback[-4000:]):
        return 1
    return 0


def ordered_ranks(failures: list[WorkerFailure]) -> list[int]:
    """The failed ranks, causes first, then by rank."""
    best: dict[int, int] = {}
    for failure in failures:
        best[failure.rank] = min(best.get(failure.rank, 2), cause_order(failure))
    return sorted(best, key=lambda rank: (best[rank], rank))


def _without_summary(traceback: str, summary: str) -> str:
    """The traceback without its last line when that line is the summary again: each
    error appears once in the text."""
    lines = traceback.rstrip().splitlines()
    if lines and lines[-1].strip() == summary.strip():
        lines = lines[:-1]
    return "\n".join(lines)


def group_failures(failures: list[WorkerFailure]) -> str:
    """One message: ranks with the same error share one entry ("[ranks 0, 2] ...").

    The first line summarizes (the cause: see :func:`cause_order`); each group follows
    with its traceback, when there is one.
    """
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    order: dict[tuple[str, str], int] = {}
    for failure in failures:
        key = (failure.summary, failure.traceback)
        groups[key].append(failure.rank)
        order[key] = min(order.get(key, 2), cause_order(failure))
    parts: list[tuple[str, str]] = []
    for (summary, traceback), ranks in sorted(groups.items(),
                                             key=lambda g: (order[g[0]], min(g[1]))):
        ordered = sorted(set(ranks))
        label = "rank" if len(ordered) == 1 else "ranks"
        head = f"[{label} {', '.join(str(r) for r in ordered)}] {summary}"
        parts.append((head, _without_summary(traceback, summary) if traceback else ""))
    if not parts:
        return "unknown failure"
    # Each error once: the first group's head is the headline, its traceback follows it.
    (first, first_body), rest = parts[0], parts[1:]
    headline = first + (f" (and {len(rest)} more)" if rest else "")
    blocks = [headline + (f"\n{first_body}" if first_body else "")]
    blocks += [head + (f"\n{body}" if body else "") for head, body in rest]
    # The errors quote the user's text: a URI with credentials in it is masked before the
    # reason reaches the event log, the driver's log, the live view or the raised error.
    return redact_text("\n\n".join(blocks))
