"""Checkpoint data for the benchmarks: random bytes no store can compress or deduplicate.

Standard library only, so worker processes of either library import it cheaply.
"""

from __future__ import annotations

import os


def make_checkpoint_dir(path: str | os.PathLike[str], size_mib: float, num_files: int = 8) -> int:
    """Fill ``path`` with ``num_files`` files totalling ``size_mib`` MiB; return the bytes.

    The bytes are random (written from one random MiB with a per-MiB counter, so that
    no two MiB are equal and writing stays fast), so compression or deduplication in a
    store cannot flatter either side.
    """
    if num_files < 1:
        raise ValueError(f"num_files must be at least 1, got {num_files!r}")
    total = int(size_mib * 2**20)
    os.makedirs(path, exist_ok=True)
    block = bytearray(os.urandom(2**20))
    per_file = total // num_files
    counter = 0
    for index in range(num_files):
        size = per_file + (total - per_file * num_files if index == num_files - 1 else 0)
        with open(os.path.join(path, f"shard_{index:03d}.bin"), "wb") as f:
            remaining = size
            while remaining > 0:
                counter += 1
                block[:8] = counter.to_bytes(8, "little")
                chunk = min(remaining, len(block))
                f.write(block[:chunk] if chunk < len(block) else block)
                remaining -= chunk
    return total
