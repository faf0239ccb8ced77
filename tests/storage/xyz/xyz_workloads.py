"""Training functions for the custom-storage tests, run in real worker processes.

* :func:`own_checkpoints`: the user's own async checkpointing. Each rank writes its shard
  into a custom store with the store's own client, on a background thread, joins it, then
  reports the checkpoint by reference (NO_UPLOAD).
* :func:`uploaded_checkpoints`: Cairn uploads (SYNC or ASYNC) into the run's storage.

``config["store"]`` picks the store: ``"xyz"`` (examples/xyzstorage, the database in
``config["db"]``) or ``"guide_only"`` (guide_only_store.py, the directory in
``config["root"]``). Faults are ``config["fault"] = {"attempt", "rank", "step", "how"}``:
``exit_after_commit`` (os._exit once the step's checkpoint is committed),
``sigkill_after_commit``, ``kill_during_write`` (SIGKILL from the writer thread after
half of the shard is written, before the report). Notes for the test go to
``config["scratch"]``: ``resumed_<attempt>_<rank>`` (the first step and the URI resumed
from) and ``committed_<attempt>_<step>`` (rank 0, once that step's checkpoint committed).
"""

from __future__ import annotations

import io
import json
import os
import random
import signal
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import cairn
from cairn import Checkpoint, CheckpointUploadMode

SHARD_BYTES = 200_000


def shard_bytes(step: int, rank: int, size: int = SHARD_BYTES) -> bytes:
    """The model shard of ``rank`` at ``step``: deterministic, so a restore can check it."""
    return random.Random(step * 1000 + rank).randbytes(size)


def note(scratch: str, name: str, value: object) -> None:
    """Write a note atomically: the test polls for it and must never read half of one."""
    path = os.path.join(scratch, name)
    with open(path + ".tmp", "w") as f:
        json.dump(value, f)
    os.replace(path + ".tmp", path)


def read_note(scratch: str, name: str) -> Any:
    with open(os.path.join(scratch, name)) as f:
        return json.load(f)


def store_uri(config: dict[str, Any], key: str) -> str:
    """The URI of ``key`` on the configured store."""
    if config["store"] == "xyz":
        return f"xyz://{key}?db={urllib.parse.quote(config['db'], safe='/')}"
    return f"flatdir://{key}?root={urllib.parse.quote(config['root'], safe='/')}"


def _put_function(config: dict[str, Any]) -> Callable[[str, bytes], object]:
    """The store's own write call, as the user's checkpointing code would use it."""
    if config["store"] == "xyz":
        import xyzstorage

        return xyzstorage.connect(config["db"]).put
    import guide_only_store

    store = guide_only_store.flatdir_store(store_uri(config, "x"))
    return lambda key, data: store.write(key, io.BytesIO(data))


def _fault(config: dict[str, Any], attempt: int, rank: int, step: int) -> str:
    fault = config.get("fault") or {}
    if (fault.get("attempt", 0), fault.get("rank"), fault.get("step")) == (attempt, rank, step):
        return str(fault["how"])
    return ""


def _write_shard(put: Callable[[str, bytes], object], prefix: str, step: int, rank: int,
                 die_midway: bool) -> None:
    put(f"{prefix}/rank_{rank}.bin", shard_bytes(step, rank))
    if die_midway:
        os.kill(os.getpid(), signal.SIGKILL)
    put(f"{prefix}/rank_{rank}.json", json.dumps({"step": step, "rank": rank}).encode())


def _restore(rank: int) -> tuple[int, str | None]:
    """(first step to run, URI resumed from), checking the restored shard byte by byte."""
    resumed = cairn.get_checkpoint()
    if resumed is None:
        return 0, None
    with resumed.as_directory() as d:
        with open(os.path.join(d, f"rank_{rank}.json")) as f:
            step = int(json.load(f)["step"])
        with open(os.path.join(d, f"rank_{rank}.bin"), "rb") as f:
            assert f.read() == shard_bytes(step, rank), "restored shard differs"
    return step + 1, resumed.uri


def own_checkpoints(config: dict[str, Any]) -> None:
    context = cairn.get_context()
    rank, attempt = context.get_world_rank(), context.get_attempt()
    put = _put_function(config)
    start, resumed_uri = _restore(rank)
    note(config["scratch"], f"resumed_{attempt}_{rank}", {"start": start, "uri": resumed_uri})
    for step in range(start, config["steps"]):
        fault = _fault(config, attempt, rank, step)
        prefix = f"{config['prefix']}/step_{step:04d}"
        writer = threading.Thread(
            target=_write_shard, args=(put, prefix, step, rank, fault == "kill_during_write"),
            name="user-checkpoint-writer",
        )
        writer.start()
        time.sleep(config.get("step_s", 0.0))  # the next step trains while the shard is written
        writer.join()
        handle = cairn.report({"step": step, "loss": 1.0 / (step + 1)},
                              checkpoint=Checkpoint(store_uri(config, prefix)),
                              checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD)
        committed = handle.wait(timeout=60)
        assert committed is not None and committed.uri == store_uri(config, prefix)
        if rank == 0:
            # Metadata of a reference goes into its manifest, in the run directory.
            committed.set_metadata({"step": step})
            note(config["scratch"], f"committed_{attempt}_{step}", committed.uri)
        if fault == "exit_after_commit":
            os._exit(1)
        if fault == "sigkill_after_commit":
            os.kill(os.getpid(), signal.SIGKILL)


def uploaded_checkpoints(config: dict[str, Any]) -> None:
    context = cairn.get_context()
    rank, attempt = context.get_world_rank(), context.get_attempt()
    mode = CheckpointUploadMode(config["mode"])
    start, resumed_uri = _restore(rank)
    note(config["scratch"], f"resumed_{attempt}_{rank}", {"start": start, "uri": resumed_uri})
    for step in range(start, config["steps"]):
        time.sleep(config.get("step_s", 0.0))
        # ASYNC takes the directory over and deletes it after the upload.
        directory = tempfile.mkdtemp()
        with open(os.path.join(directory, f"rank_{rank}.bin"), "wb") as f:
            f.write(shard_bytes(step, rank))
        with open(os.path.join(directory, f"rank_{rank}.json"), "w") as f:
            json.dump({"step": step, "rank": rank}, f)
        handle = cairn.report({"step": step, "loss": 1.0 / (step + 1)},
                              checkpoint=Checkpoint.from_directory(directory),
                              checkpoint_upload_mode=mode)
        fault = _fault(config, attempt, rank, step)
        if fault or (rank == 0 and config.get("note_commits")):
            committed = handle.wait(timeout=60)
            assert committed is not None
            if rank == 0:
                note(config["scratch"], f"committed_{attempt}_{step}", committed.uri)
        if fault == "exit_after_commit":
            os._exit(1)
        if fault == "sigkill_after_commit":
            os.kill(os.getpid(), signal.SIGKILL)
