"""A directory two ranks share, whose first upload fails while the other rank is held
(Ray Train's pattern of every rank writing its shard into one directory).

``faultfs-held://`` is :class:`fault_store.FaultStore` whose writes of keys containing
``fail`` fail with ``ENOSPC`` (permanent: not retried) only once the other rank has
reported: the failing write first leaves ``upload_started`` in ``signal``, then waits for
``rank_0_reported`` there (at most ``hold_s`` seconds: a SYNC report of rank 0 returns
only once the report is resolved).
"""

from __future__ import annotations

import errno
import json
import os
import time
import urllib.parse
from typing import Any, BinaryIO

from fault_store import FaultStore

import cairn
from cairn import Checkpoint, CheckpointUploadMode
from cairn.storage import register_scheme

SCHEME = "faultfs-held"
STARTED = "upload_started"
REPORTED = "rank_0_reported"


def wait_for_file(path: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


class HeldFailureStore(FaultStore):
    def __init__(self, root: str, *, fail: str, signal: str, hold_s: float) -> None:
        super().__init__(root)
        self.fail = fail
        self.signal = signal
        self.hold_s = hold_s

    def write(self, key: str, stream: BinaryIO) -> None:
        if self.fail in key:
            open(os.path.join(self.signal, STARTED), "w").close()
            # Rank 0's report reaches the controller before this upload's failure does.
            if wait_for_file(os.path.join(self.signal, REPORTED), self.hold_s):
                time.sleep(0.3)
            raise OSError(errno.ENOSPC, "No space left on device (injected)", key)
        super().write(key, stream)


def held_factory(uri: str) -> HeldFailureStore:
    options = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(uri).query))
    return HeldFailureStore(options["root"], fail=options["fail"], signal=options["signal"],
                            hold_s=float(options.get("hold_s", 3.0)))


def register() -> None:
    register_scheme(SCHEME, held_factory, overwrite=True)


def held_uri(root: str, *, fail: str, signal: str, hold_s: float = 3.0) -> str:
    os.makedirs(root, exist_ok=True)
    query = urllib.parse.urlencode({"root": root, "fail": fail, "signal": signal,
                                    "hold_s": hold_s})
    return f"{SCHEME}://storage?{query}"


def shards_with_a_failing_first_upload(config: dict[str, Any]) -> dict[str, str]:
    """Every rank writes shard_<rank> into one directory per epoch and reports it. In
    epoch 0, rank 1 reports first and uploads at once (its upload fails in the store);
    rank 0 reports once that upload started, and is held for the directory. Returns, and
    leaves in ``signal``/said_<rank>.json, what became of each report (index -> outcome)."""
    rank = cairn.get_context().get_world_rank()
    mode = CheckpointUploadMode(config["mode"])
    signal = config["signal"]
    handles = {}
    for epoch in range(2):
        directory = os.path.join(config["dir"], f"epoch_{epoch}")
        os.makedirs(directory, exist_ok=True)
        if epoch == 0 and rank == 0:
            assert wait_for_file(os.path.join(signal, STARTED), 120)
        with open(os.path.join(directory, f"shard_{rank}"), "wb") as f:
            f.write(b"shard %d of epoch %d" % (rank, epoch))
        handles[epoch + 1] = cairn.report({"epoch": epoch},
                                          checkpoint=Checkpoint.from_directory(directory),
                                          checkpoint_upload_mode=mode)
        if epoch == 0 and rank == 0:
            open(os.path.join(signal, REPORTED), "w").close()
    said = {}
    for index, handle in handles.items():
        try:
            handle.wait(timeout=60)
            said[str(index)] = "committed"
        except Exception as exc:
            said[str(index)] = type(exc).__name__
    with open(os.path.join(signal, f"said_{rank}.json"), "w") as f:
        json.dump(said, f)
    return said
