"""Training and validation functions for the Ray Train v2 API tests (real workers)."""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from typing import Any

import cairn
from cairn import Checkpoint, CheckpointUploadMode
from cairn.collective import barrier, broadcast_from_rank_zero


def wait_for_file(path: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(path)
        time.sleep(0.01)


def _write(directory: str, files: dict[str, bytes]) -> Checkpoint:
    for name, data in files.items():
        with open(os.path.join(directory, name), "wb") as f:
            f.write(data)
    return Checkpoint.from_directory(directory)


# --- the same file from several ranks ----------------------------------------------------


def every_rank_saves_model(config: dict[str, Any]) -> None:
    """Ray's quickstart: every rank saves model.pt (and its own file) and reports it."""
    rank = cairn.get_context().get_world_rank()
    kind = config["content"]
    mode = CheckpointUploadMode(config.get("mode", "SYNC"))
    for epoch in range(config.get("epochs", 2)):
        model = b"weights-%d" % epoch
        if kind == "differ" and rank == 1:
            model = b"WEIGHTS-%d" % epoch  # same size, different bytes
        elif kind == "sizes" and rank == 1:
            model += b"-longer"
        directory = tempfile.mkdtemp()
        checkpoint = _write(directory, {"model.pt": model, f"rank_{rank}.txt": b"%d" % rank})
        handle = cairn.report({"epoch": epoch}, checkpoint=checkpoint,
                              checkpoint_upload_mode=mode)
        handle.wait()


def shards_in_one_directory(config: dict[str, Any]) -> None:
    """Ray Train's pattern: every rank writes shard_<rank> into one directory of the node
    and reports that directory. Rank 1 reports first, while rank 0's shard is still empty
    (rank 0 fills it only once rank 1's report() returned)."""
    rank = cairn.get_context().get_world_rank()
    for epoch in range(2):
        directory = os.path.join(config["dir"], f"epoch_{epoch}")
        os.makedirs(directory, exist_ok=True)
        reported = os.path.join(config["dir"], f"rank_1_reported_{epoch}")
        shard = os.path.join(directory, f"shard_{rank}")
        # config["rename"]: written as a temporary file, then renamed (as torch.save
        # callers and Orbax do).
        writing = shard + ".tmp" if config["rename"] else shard
        with open(writing, "wb") as f:
            if rank == 0:
                f.flush()
                wait_for_file(reported)
            f.write(b"shard %d of epoch %d" % (rank, epoch))
        os.replace(writing, shard)
        cairn.report({"epoch": epoch}, checkpoint=Checkpoint.from_directory(directory),
                     checkpoint_upload_mode=CheckpointUploadMode.ASYNC,
                     delete_local_checkpoint_after_upload=config["delete"])
        if rank == 1:
            open(reported, "w").close()


def name_without_checkpoint(config: dict[str, Any]) -> None:
    """Rank 0 passes the checkpoint; the other ranks pass None with the same name."""
    rank = cairn.get_context().get_world_rank()
    for epoch in range(2):
        checkpoint = None
        if rank == 0:
            checkpoint = _write(tempfile.mkdtemp(), {"model.pt": b"epoch%d" % epoch})
        name = f"epoch_{epoch}" if config.get("agree", True) or rank == 0 else f"other_{epoch}"
        cairn.report({"epoch": epoch}, checkpoint=checkpoint, checkpoint_dir_name=name)


# --- collectives -------------------------------------------------------------------------


def barrier_and_broadcast(config: dict[str, Any]) -> dict[str, Any]:
    """Each rank leaves a file, meets at a barrier, then all take rank 0's data."""
    context = cairn.get_context()
    rank, size = context.get_world_rank(), context.get_world_size()
    scratch = config["scratch"]
    if rank == size - 1:
        time.sleep(0.3)  # the last rank arrives late: the others must wait for it
    open(os.path.join(scratch, f"arrived_{rank}"), "w").close()
    barrier()
    seen = sorted(n for n in os.listdir(scratch) if n.startswith("arrived_"))
    assert seen == [f"arrived_{r}" for r in range(size)], seen
    cairn.report({"step": 0})
    data = {"seed": 1234, "from": rank} if rank == 0 else {"ignored": rank}
    received = broadcast_from_rank_zero(data)
    assert received == {"seed": 1234, "from": 0}, received
    # Ordered with reports: a broadcast after a second report, None from rank 0 too.
    cairn.report({"step": 1})
    assert broadcast_from_rank_zero(None if rank == 0 else "x") is None
    with open(os.path.join(scratch, f"received_{rank}.json"), "w") as f:
        json.dump(received, f)
    return received


def barrier_one_rank_never_reaches(config: dict[str, Any]) -> None:
    rank = cairn.get_context().get_world_rank()
    if rank == 1:
        time.sleep(600)  # never arrives: the collective timeout must end the attempt
    barrier()


def broadcast_unpicklable(config: dict[str, Any]) -> None:
    broadcast_from_rank_zero({"lock": threading.Lock()})


def mismatched_collectives(config: dict[str, Any]) -> None:
    if cairn.get_context().get_world_rank() == 0:
        barrier()
    else:
        broadcast_from_rank_zero(1)


def barrier_after_different_report_counts(config: dict[str, Any]) -> None:
    if cairn.get_context().get_world_rank() == 0:
        cairn.report({"extra": 1})
    barrier()


def barrier_then_finish_early(config: dict[str, Any]) -> None:
    if cairn.get_context().get_world_rank() == 0:
        barrier()


# --- get_all_reported_checkpoints ---------------------------------------------------------


def _listing(items: list[cairn.ReportedCheckpoint]) -> list[dict[str, Any]]:
    return [{"name": os.path.basename(i.checkpoint.path), "metrics": i.metrics,
             "status": i.status.value} for i in items]


def reporting_and_listing(config: dict[str, Any]) -> None:
    """Only rank 0 passes checkpoints; every rank lists them after each report."""
    context = cairn.get_context()
    rank = context.get_world_rank()
    scratch = config["scratch"]
    start = 0
    resumed = cairn.get_checkpoint()
    if resumed is not None:
        start = int(resumed.get_metadata()["epoch"]) + 1
        # A restarted worker sees the run's committed checkpoints at once.
        at_start = cairn.get_all_reported_checkpoints(consistency_mode="COMMITTED")
        with open(os.path.join(scratch, f"restart_{rank}.json"), "w") as f:
            json.dump(_listing(at_start), f)
    mode = CheckpointUploadMode(config.get("mode", "SYNC"))
    for epoch in range(start, config["epochs"]):
        checkpoint = None
        if rank == 0:
            checkpoint = _write(tempfile.mkdtemp(), {"model.pt": b"%d" % epoch})
            checkpoint.set_metadata({"epoch": epoch})
        cairn.report({"epoch": epoch, "score": config["scores"][epoch]}, checkpoint=checkpoint,
                     checkpoint_upload_mode=mode)
        listed = cairn.get_all_reported_checkpoints(
            consistency_mode=cairn.CheckpointConsistencyMode.COMMITTED)
        with open(os.path.join(scratch, f"list_{rank}_{epoch}.json"), "w") as f:
            json.dump(_listing(listed), f)
        if epoch == config.get("crash_at") and context.get_attempt() == 0 and rank == 1:
            os._exit(5)


def bad_reported_call(config: dict[str, Any]) -> None:
    if config["case"] == "mode":
        cairn.get_all_reported_checkpoints(consistency_mode="LATEST")
    else:
        cairn.get_all_reported_checkpoints(timeout_s=-1)


# --- validation -------------------------------------------------------------------------


def read_score(checkpoint: Checkpoint, **kwargs: Any) -> dict[str, Any]:
    """A validation function: the score stored in the checkpoint, plus ``offset``."""
    with checkpoint.as_directory() as d, open(os.path.join(d, "score.json")) as f:
        score = json.load(f)["score"]
    gate = kwargs.get("gate")
    if gate and score == kwargs.get("gated_score"):
        # Holds this validation until the test (or the train function) opens the gate.
        open(gate + ".started", "w").close()
        wait_for_file(gate, timeout=600)
    return {"val_score": score + kwargs.get("offset", 0), "validated_by": "read_score"}


def validating(config: dict[str, Any]) -> None:
    """Rank 0 reports checkpoints with a score file, asking for validation."""
    rank = cairn.get_context().get_world_rank()
    scratch = config["scratch"]
    start = 0
    resumed = cairn.get_checkpoint()
    if resumed is not None:
        start = int(resumed.get_metadata()["epoch"]) + 1
    for epoch in range(start, config["epochs"]):
        checkpoint = None
        validation: bool | cairn.ValidationTaskConfig = False
        if rank == 0:
            score = config["scores"][epoch]
            checkpoint = _write(tempfile.mkdtemp(), {"score.json": json.dumps(
                {"score": score}).encode()})
            checkpoint.set_metadata({"epoch": epoch})
            validation = cairn.ValidationTaskConfig(fn_kwargs=config.get("fn_kwargs", {}))
        cairn.report({"epoch": epoch}, checkpoint=checkpoint, validation=validation)
        listed = cairn.get_all_reported_checkpoints(consistency_mode="COMMITTED")
        with open(os.path.join(scratch, f"committed_{rank}_{epoch}.json"), "w") as f:
            json.dump(_listing(listed), f)
    if config.get("open_gate"):
        open(config["open_gate"], "w").close()
    if config.get("list_validated"):
        listed = cairn.get_all_reported_checkpoints()
        with open(os.path.join(scratch, f"validated_{rank}.json"), "w") as f:
            json.dump(_listing(listed), f)


def validation_without_config(config: dict[str, Any]) -> None:
    checkpoint = _write(tempfile.mkdtemp(), {"score.json": b'{"score": 1}'})
    cairn.report({"epoch": 0}, checkpoint=checkpoint, validation=True)


def validation_without_checkpoint(config: dict[str, Any]) -> None:
    cairn.report({"epoch": 0}, validation=True)


# --- the score attribute on the rank whose metrics a checkpoint keeps ---------------------


def score_on_one_rank(config: dict[str, Any]) -> None:
    """Each report, ``checkpoint_ranks`` pass a checkpoint (each its own file) and
    ``score_rank`` alone reports ``loss`` (losses[i] for report i)."""
    rank = cairn.get_context().get_world_rank()
    for loss in config["losses"]:
        metrics: dict[str, Any] = {"step": loss}
        if rank == config["score_rank"]:
            metrics["loss"] = loss
        checkpoint = None
        if rank in config["checkpoint_ranks"]:
            checkpoint = _write(tempfile.mkdtemp(), {f"rank_{rank}.txt": b"%d" % rank})
        cairn.report(metrics, checkpoint=checkpoint)


# --- a refused checkpoint the train function catches ------------------------------------


def references_refused_then_metrics(config: dict[str, Any]) -> dict[str, str]:
    """Each rank writes its checkpoint into the run directory (``<run>/step_10`` on rank 0,
    ``<run>/step_10_rank1`` on rank 1) and reports it NO_UPLOAD under the name ``step_10``:
    the locations differ, so the report is refused. The train function catches that, makes
    a metric-only report and returns what each report did."""
    context = cairn.get_context()
    rank = context.get_world_rank()
    name = "step_10" if rank == 0 else f"step_10_rank{rank}"
    directory = context.get_storage().build_checkpoint_path_from_name(name)
    os.makedirs(directory)
    checkpoint = _write(directory, {"model.pt": b"weights-%d" % rank})
    said = {}
    try:
        cairn.report({"epoch": 0}, checkpoint=checkpoint, checkpoint_dir_name="step_10",
                     checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD).wait()
        said["1"] = "committed"
    except cairn.ReportError as exc:
        said["1"] = type(exc).__name__
    try:
        cairn.report({"epoch": 1})
        said["2"] = "reported"
    except cairn.ReportError as exc:
        said["2"] = type(exc).__name__
    return said


def collision_caught_then_metrics(config: dict[str, Any]) -> dict[str, str]:
    """Every rank saves model.pt, each with different content, and reports it (SYNC): the
    report is refused after the uploads (a collision). The train function catches that,
    then makes a metric-only report and returns what each report did."""
    rank = cairn.get_context().get_world_rank()
    said = {}
    checkpoint = _write(tempfile.mkdtemp(), {"model.pt": b"weights-%d" % rank})
    try:
        cairn.report({"epoch": 0}, checkpoint=checkpoint)
        said["1"] = "committed"
    except cairn.CheckpointCollisionError as exc:
        said["1"] = type(exc).__name__
    try:
        cairn.report({"epoch": 1})
        said["2"] = "reported"
    except Exception as exc:
        said["2"] = f"{type(exc).__name__}: {exc}"
    return said
