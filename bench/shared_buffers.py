"""What a kept rank's snapshot copy costs in shared memory (``keep_survivors``) against
private memory, first and later snapshots, side by side in one run.

Usage::

    python bench/shared_buffers.py [--mib 1024] [--rounds 3]

``copy_state`` copies a state of one ``--mib`` MiB float tensor into a new buffer set
(the first snapshot: the buffers are allocated and touched) and then into the same set
again (every later snapshot: a copy into memory already mapped), with ``shared=True``
(one ``memfd_create`` arena, as a kept rank's ``report_snapshot`` does) and without
(private memory, the default), alternating; medians of ``--rounds`` rounds, as ratios
to private memory.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
for _path in (str(BENCH_DIR.parent), str(BENCH_DIR)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from _harness import print_table  # noqa: E402


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024, help="state size in MiB")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (median)")
    return parser.parse_args(argv)


def _copies(state: Any, shared: bool) -> tuple[float, float]:
    from cairn._src.torch.snapshot_buffers import BufferSet, copy_state

    buffer_set = BufferSet()
    started = time.perf_counter()
    copy_state(state, buffer_set, shared=shared)
    first = time.perf_counter() - started
    started = time.perf_counter()
    copy_state(state, buffer_set, shared=shared)
    return first, time.perf_counter() - started


def run(args: Any) -> list[dict[str, Any]]:
    import torch

    state = {"w": torch.ones(args.mib << 18)}
    times: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for _ in range(args.rounds):
        for shared in (False, True):
            times[shared].append(_copies(state, shared))
    rows = []
    for index, which in ((0, "first snapshot (buffers allocated)"),
                         (1, "later snapshot (buffers reused)")):
        cairn_value = statistics.median(t[index] for t in times[True])
        reference = statistics.median(t[index] for t in times[False])
        rows.append({
            "benchmark": "shared_buffers",
            "metric": f"snapshot copy, {which}, {args.mib} MiB, shared memory",
            "cairn": cairn_value, "reference": reference, "unit": "s",
            "ratio": cairn_value / reference if reference else None,
            "reference_name": "private memory (the default), same run",
            "note": f"median of {args.rounds}; shared "
                    + ", ".join(f"{t[index]:.3f}" for t in times[True]) + "; private "
                    + ", ".join(f"{t[index]:.3f}" for t in times[False]),
        })
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    print_table(run(parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
