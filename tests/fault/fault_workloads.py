"""Training functions and helpers for the fault-injection suite (real processes, signals)."""

from __future__ import annotations

import json
import os
import signal
import tempfile
import threading
import time
from typing import Any

import cairn
from cairn import Checkpoint, CheckpointUploadMode, ChecksumMismatchError


def _note(config: dict[str, Any], name: str, value: object) -> None:
    with open(os.path.join(config["scratch"], name), "w") as f:
        f.write(json.dumps(value))


def _kill_self_when(predicate: Any, poll_s: float = 0.0005) -> None:
    def watch() -> None:
        while not predicate():
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, daemon=True).start()


def resumable(config: dict[str, Any]) -> None:
    """``steps`` steps, one checkpoint each; faults by "attempt:rank:step" in config."""
    context = cairn.get_context()
    rank, attempt = context.get_world_rank(), context.get_attempt()
    faults: dict[str, str] = config.get("faults", {})
    mode = CheckpointUploadMode(config.get("mode", "SYNC"))
    start = 0
    resumed = cairn.get_checkpoint()
    if resumed is not None:
        resumed.verify()  # never a partial or corrupt checkpoint
        with resumed.as_directory() as d, open(os.path.join(d, "rank_0.json")) as f:
            start = json.load(f)["step"] + 1
    _note(config, f"resumed_{attempt}_{rank}", start)
    if rank == 0 and "crash_time" in os.listdir(config["scratch"]):
        _note(config, f"first_step_time_{attempt}", time.time())
    for step in range(start, config["steps"]):
        fault = faults.get(f"{attempt}:{rank}:{step}", "")
        time.sleep(config.get("step_s", 0.0))
        if fault.startswith("delay"):
            time.sleep(float(fault.split("=")[1]))
        directory = tempfile.mkdtemp()
        with open(os.path.join(directory, f"rank_{rank}.json"), "w") as f:
            json.dump({"step": step, "rank": rank}, f)
        blob_mib = config.get("blob_mib", 0)
        if blob_mib:
            with open(os.path.join(directory, f"blob_{rank}.bin"), "wb") as f:
                f.write(os.urandom(blob_mib << 20))
        if fault == "raise":
            raise RuntimeError(f"injected failure at step {step}")
        if fault == "kill_during_upload":
            name = f"checkpoint_{config['first_index'] + step:06d}"
            target = os.path.join(config["run_dir"], name)
            _kill_self_when(lambda t=target: os.path.isdir(t))
        if fault == "kill_before_commit":
            threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGKILL)).start()
        handle = cairn.report({"step": step, "loss": 1.0 / (step + 1)},
                              checkpoint=Checkpoint.from_directory(directory),
                              checkpoint_upload_mode=mode)
        if mode is CheckpointUploadMode.SYNC and rank == 0 and handle.error is None:
            _note(config, f"sync_returned_{step}", handle.index)
        if fault.startswith("outage="):
            # After the commit: the store fails the next N operations on the run index
            # (fault_store's outage), and the attempt fails.
            with open(config["outage"], "w") as f:
                f.write(fault.split("=")[1])
            raise RuntimeError(f"injected failure at step {step}, storage out")
        if fault == "exit_after":
            _note(config, "crash_time", time.time())
            os._exit(1)
        if fault == "kill_after":
            os.kill(os.getpid(), signal.SIGKILL)


def index_answer_lost(config: dict[str, Any]) -> None:
    """Reports ``steps`` checkpoints asking for their validation; before the first commit
    the store starts losing the answers of ``lost`` index writes (``lying_store``)."""
    import lying_store

    resumed = cairn.get_checkpoint()
    start = 0
    if resumed is not None:
        with resumed.as_directory() as d, open(os.path.join(d, "step.json")) as f:
            start = json.load(f)["step"] + 1
    elif cairn.get_context().get_world_rank() == 0:
        lying_store.add_rule(config["control"], "lost_answer", "cairn_run.json",
                             times=config["lost"])
    for step in range(start, config["steps"]):
        directory = tempfile.mkdtemp()
        with open(os.path.join(directory, "step.json"), "w") as f:
            json.dump({"step": step}, f)
        cairn.report({"step": step}, checkpoint=Checkpoint.from_directory(directory),
                     validation=True)


def step_score(checkpoint: Checkpoint) -> dict[str, Any]:
    """A validation function: the step stored in the checkpoint."""
    with checkpoint.as_directory() as d, open(os.path.join(d, "step.json")) as f:
        return {"val_step": json.load(f)["step"]}


def diverging(config: dict[str, Any]) -> None:
    """Rank 1 skips the checkpoint report that the other ranks make."""
    rank = cairn.get_context().get_world_rank()
    if config["how"] == "hang" and rank == 1:
        time.sleep(3600)
    if rank == 1:
        return
    directory = tempfile.mkdtemp()
    with open(os.path.join(directory, f"rank_{rank}.json"), "w") as f:
        f.write("{}")
    cairn.report({"step": 0}, checkpoint=Checkpoint.from_directory(directory))


def damaged_elsewhere(config: dict[str, Any]) -> None:
    """Reports one checkpoint, then (once resumed) fails on damage in some other data."""
    if cairn.get_checkpoint() is None:
        directory = tempfile.mkdtemp()
        with open(os.path.join(directory, "x.json"), "w") as f:
            json.dump({"step": 0}, f)
        cairn.report({"step": 0}, checkpoint=Checkpoint.from_directory(directory))
        return
    _note(config, f"damaged_elsewhere_{cairn.get_context().get_attempt()}", 1)
    raise ChecksumMismatchError("a dataset shard failed its checksum")


# keep_survivors: a weak reference to each attempt's cyclic garbage, in this process.
_ATTEMPT_GARBAGE: dict[int, Any] = {}


def leaves_cyclic_garbage(config: dict[str, Any]) -> dict[str, Any]:
    """Each attempt makes an object held only by a reference cycle of its frames, notes
    what a later attempt in the same process finds of the earlier ones, and (attempt 0,
    rank 1) exits after its report, so that rank 0 is kept and stopped."""
    import gc
    import weakref

    context = cairn.get_context()
    rank, attempt = context.get_world_rank(), context.get_attempt()

    class Held:
        pass

    held = Held()
    cycle: list[Any] = [held]
    cycle.append(cycle)
    _ATTEMPT_GARBAGE[attempt] = weakref.ref(held)
    seen = {"frozen": gc.get_freeze_count() > 0, "attempts_here": sorted(_ATTEMPT_GARBAGE),
            "earlier_alive": [a for a, ref in sorted(_ATTEMPT_GARBAGE.items())
                              if a < attempt and ref() is not None]}
    del held
    cairn.report({"step": attempt})
    if attempt == 0 and rank == 1:
        os._exit(1)
    cairn.collective.barrier()  # rank 0 is stopped here in attempt 0
    return seen


# keep_survivors: a weak reference to each attempt's worker session and setup message.
_ATTEMPT_SESSIONS: dict[int, Any] = {}


def outlives_its_session(config: dict[str, Any]) -> dict[str, Any]:
    """Notes which worker sessions (and their setup messages) of earlier attempts in this
    process a full collection leaves alive; (attempt 0, rank 1) exits after its report, so
    that rank 0 is kept and stopped."""
    import gc
    import weakref

    from cairn._src.worker.session import get_session

    context = cairn.get_context()
    rank, attempt = context.get_world_rank(), context.get_attempt()
    session = get_session("outlives_its_session")
    _ATTEMPT_SESSIONS[attempt] = (weakref.ref(session), weakref.ref(session._setup))
    del session
    gc.collect()
    seen = {"attempts_here": sorted(_ATTEMPT_SESSIONS),
            "earlier_alive": [[a, name] for a, refs in sorted(_ATTEMPT_SESSIONS.items())
                              for name, ref in zip(("session", "setup"), refs, strict=True)
                              if a < attempt and ref() is not None]}
    cairn.report({"step": attempt})
    if attempt == 0 and rank == 1:
        os._exit(1)
    cairn.collective.barrier()  # rank 0 is stopped here in attempt 0
    return seen
