"""Training functions the trainer tests run in real worker processes."""

from __future__ import annotations

import json
import os
import tempfile
import time
from typing import Any

import cairn
from cairn import Checkpoint, CheckpointUploadMode


def write_checkpoint(directory: str, files: dict[str, bytes]) -> Checkpoint:
    for name, data in files.items():
        path = os.path.join(directory, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
    return Checkpoint.from_directory(directory)


def counting(config: dict[str, Any]) -> str:
    """Reports ``steps`` metric-only reports; returns a value from rank 0."""
    context = cairn.get_context()
    for step in range(config["steps"]):
        cairn.report({"step": step, "rank": context.get_world_rank()})
    print(f"hello from rank {context.get_world_rank()}")
    return f"done by {context.get_world_rank()} of {context.get_world_size()}"


def checkpoint_every_step(config: dict[str, Any]) -> None:
    """Each rank writes its own file into every checkpoint; records get_checkpoint()."""
    context = cairn.get_context()
    rank = context.get_world_rank()
    mode = CheckpointUploadMode(config.get("mode", "SYNC"))
    start = 0
    resumed = cairn.get_checkpoint()
    if resumed is not None:
        with resumed.as_directory() as d, open(os.path.join(d, "rank_0.json")) as f:
            start = json.load(f)["step"] + 1
    handles = []
    for step in range(start, config["steps"]):
        with tempfile.TemporaryDirectory() as d:
            files = {f"rank_{rank}.json": json.dumps({"step": step, "rank": rank}).encode()}
            checkpoint = write_checkpoint(d, files)
            checkpoint.set_metadata({"written_by": rank})
            if mode is CheckpointUploadMode.ASYNC:
                # ASYNC takes ownership of a copy; the temp dir goes away at once.
                own = tempfile.mkdtemp()
                checkpoint = write_checkpoint(own, files)
                checkpoint.set_metadata({"written_by": rank})
            handle = cairn.report({"step": step, "score": config.get("scores", {}).get(
                str(step), step)}, checkpoint=checkpoint, checkpoint_upload_mode=mode)
            handles.append(handle)
        if mode is CheckpointUploadMode.SYNC:
            latest = cairn.get_checkpoint()
            assert latest is not None
            _record(config, rank, step, latest.path)
    for handle in handles:
        handle.wait()


def _record(config: dict[str, Any], rank: int, step: int, path: str) -> None:
    scratch = config.get("scratch")
    if scratch:
        with open(os.path.join(scratch, f"latest_{rank}_{step}"), "w") as f:
            f.write(path)


def bad_report(config: dict[str, Any]) -> None:
    """Calls report() with the bad input named by config['case']."""
    case = config["case"]
    rank = cairn.get_context().get_world_rank()
    d = tempfile.mkdtemp()
    checkpoint = write_checkpoint(d, {f"r{rank}.bin": b"x"})
    if case == "not_dict":
        cairn.report([("loss", 1.0)])  # type: ignore[arg-type]
    elif case == "non_string_key":
        cairn.report({1: 2.0})  # type: ignore[dict-item]
    elif case == "unserializable":
        cairn.report({"model": object()})
    elif case == "missing_path":
        cairn.report({"acc": 1.0}, checkpoint=Checkpoint.from_directory("/no/such/checkpoint"))
    elif case == "unsafe_dir_name":
        cairn.report({"acc": 1.0}, checkpoint=checkpoint, checkpoint_dir_name="../escape")
    elif case == "unknown_mode":
        cairn.report({"acc": 1.0}, checkpoint=checkpoint, checkpoint_upload_mode="fast")
    elif case == "missing_score":
        cairn.report({"loss": 1.0}, checkpoint=checkpoint)
    elif case == "reused_dir_name":
        cairn.report({"acc": 1.0}, checkpoint=checkpoint, checkpoint_dir_name="best")
        again = write_checkpoint(tempfile.mkdtemp(), {f"r{rank}.bin": b"y"})
        cairn.report({"acc": 1.0}, checkpoint=again, checkpoint_dir_name="best")
    elif case == "disagreeing_dir_names":
        cairn.report({"acc": 1.0}, checkpoint=checkpoint, checkpoint_dir_name=f"epoch_{rank}")
    elif case == "collision":
        shared = write_checkpoint(tempfile.mkdtemp(), {"model.pt": b"rank%d" % rank})
        cairn.report({"acc": 1.0}, checkpoint=shared)
    else:
        raise AssertionError(case)


def wait_for_file(path: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(path)
        time.sleep(0.01)


def metric_reports_do_not_wait(config: dict[str, Any]) -> None:
    """Rank 0 reports many times while rank 1 is parked until rank 0 is done."""
    rank = cairn.get_context().get_world_rank()
    signal = os.path.join(config["scratch"], "rank0_done")
    if rank == 0:
        for step in range(200):
            cairn.report({"step": step})
        open(signal, "w").close()
    else:
        wait_for_file(signal)
        for step in range(200):
            cairn.report({"step": step})


def async_backpressure(config: dict[str, Any]) -> None:
    """ASYNC reports with max_pending_uploads=1: at most one pending per worker."""
    handles = []
    for step in range(4):
        d = tempfile.mkdtemp()
        rank = cairn.get_context().get_world_rank()
        checkpoint = write_checkpoint(d, {f"blob_{rank}.bin": os.urandom(1 << 20)})
        handle = cairn.report({"step": step}, checkpoint=checkpoint,
                              checkpoint_upload_mode=CheckpointUploadMode.ASYNC)
        # With one slot, the previous report must be committed before this one was queued.
        if handles:
            assert handles[-1][0].done(), "report() did not wait for a free upload slot"
        handles.append((handle, d))
    last, _ = handles[-1]
    committed = last.wait(timeout=60)
    assert committed is not None and committed.path.endswith("checkpoint_000004")
    for _, directory in handles:
        assert not os.path.exists(directory), "ASYNC deletes the local copy by default"


def async_then_return(config: dict[str, Any]) -> None:
    """The last report is ASYNC and the function returns at once: fit() must wait for it."""
    d = tempfile.mkdtemp()
    rank = cairn.get_context().get_world_rank()
    checkpoint = write_checkpoint(d, {f"big_{rank}.bin": os.urandom(8 << 20)})
    cairn.report({"step": 0}, checkpoint=checkpoint,
                 checkpoint_upload_mode=CheckpointUploadMode.ASYNC,
                 delete_local_checkpoint_after_upload=False)


def sync_keeps_local_copy(config: dict[str, Any]) -> None:
    d = os.path.join(config["scratch"], f"local_{cairn.get_context().get_world_rank()}")
    os.makedirs(d)
    cairn.report({"step": 0}, checkpoint=write_checkpoint(d, {"a.bin": b"a"}))
    assert os.path.exists(os.path.join(d, "a.bin")), "SYNC keeps the local copy by default"
    d2 = os.path.join(config["scratch"], f"deleted_{cairn.get_context().get_world_rank()}")
    os.makedirs(d2)
    cairn.report({"step": 1}, checkpoint=write_checkpoint(d2, {"b.bin": b"b"}),
                 delete_local_checkpoint_after_upload=True)
    assert not os.path.exists(d2)


def no_upload_reference(config: dict[str, Any]) -> None:
    """The user writes checkpoints with their own code, then reports them by reference."""
    rank = cairn.get_context().get_world_rank()
    start = 0
    resumed = cairn.get_checkpoint()
    if resumed is not None:
        start = resumed.get_metadata()["step"] + 1
        with resumed.as_directory() as d:
            assert open(os.path.join(d, "rank_1.bin"), "rb").read() == b"step%d" % (start - 1)
    for step in range(start, config["steps"]):
        target = f"{config['target']}/step_{step}"
        os.makedirs(target, exist_ok=True)
        with open(os.path.join(target, f"rank_{rank}.bin"), "wb") as f:
            f.write(b"step%d" % step)
        marker = os.path.join(config["target"], f"written_{step}_{rank}")
        open(marker, "w").close()
        # Every rank's shard is in one directory before it is reported.
        for other in range(cairn.get_context().get_world_size()):
            wait_for_file(os.path.join(config["target"], f"written_{step}_{other}"))
        checkpoint = Checkpoint(target)
        if rank == 0:
            # Metadata set before the report goes into the manifest, not into the files.
            checkpoint.set_metadata({"before": step})
        handle = cairn.report({"step": step}, checkpoint=checkpoint,
                              checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD)
        committed = handle.wait(timeout=60)
        assert committed is not None
        if rank == 0:
            committed.update_metadata({"step": step})
        if config.get("crash_at") == step and cairn.get_context().get_attempt() == 0:
            os._exit(3)


def upload_fn_run(config: dict[str, Any]) -> None:
    import shutil

    def my_upload(checkpoint: Checkpoint, dir_name: str) -> Checkpoint:
        destination = os.path.join(config["target"], dir_name)
        shutil.copytree(checkpoint.path, destination, dirs_exist_ok=True)
        return Checkpoint(destination)

    d = tempfile.mkdtemp()
    checkpoint = write_checkpoint(d, {f"rank_{cairn.get_context().get_world_rank()}.bin": b"z"})
    cairn.report({"step": 0}, checkpoint=checkpoint, checkpoint_upload_fn=my_upload)


def run_dir(config: cairn.RunConfig) -> str:
    assert config.storage_path is not None and config.name is not None
    return os.path.join(os.fspath(config.storage_path), config.name)


def deferred_reports(config: dict[str, Any]) -> None:
    """Snapshots written on the upload thread, from a copy taken on the train loop."""
    from cairn._src.worker.session import get_session

    rank = cairn.get_context().get_world_rank()
    session = get_session("report")
    handles = []
    for step in range(3):
        state = {"step": step, "rank": rank}
        snapshot = dict(state)  # the copy the train loop is blocked for

        def write(directory: str, snapshot: dict[str, int] = snapshot) -> None:
            with open(os.path.join(directory, f"state_{rank}.json"), "w") as f:
                json.dump(snapshot, f)

        handles.append(session.report_deferred({"step": step}, files=[f"state_{rank}.json"],
                                               write=write))
    if config.get("lie"):
        session.report_deferred({"step": 9}, files=["declared.bin"], write=lambda d: None)
    for handle in handles:
        handle.wait()


def describe_context(config: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Every rank writes its context; rank 0 returns all of them once all have reported."""
    context = cairn.get_context()
    description = {
        "world_rank": context.get_world_rank(),
        "world_size": context.get_world_size(),
        "local_rank": context.get_local_rank(),
        "local_world_size": context.get_local_world_size(),
        "node_rank": context.get_node_rank(),
        "experiment_name": context.get_experiment_name(),
        "attempt": context.get_attempt(),
        "run_uri": context.get_storage().run_uri,
        "checkpoint": cairn.get_checkpoint(),
    }
    d = tempfile.mkdtemp()
    with open(os.path.join(d, f"context_{context.get_world_rank()}.json"), "w") as f:
        json.dump(description, f)
    handle = cairn.report({"rank": context.get_world_rank()},
                          checkpoint=Checkpoint.from_directory(d))
    committed = handle.wait()
    if context.get_world_rank() != 0 or committed is None:
        return None
    with committed.as_directory() as directory:
        return [json.load(open(os.path.join(directory, f"context_{r}.json")))
                for r in range(context.get_world_size())]


def upload_fn_in_place(config: dict[str, Any]) -> None:
    """ASYNC with an upload function that registers the directory where it already is."""
    rank = cairn.get_context().get_world_rank()
    directory = os.path.join(config["target"], "in_place")
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"rank_{rank}.bin"), "wb") as f:
        f.write(b"kept")
    handle = cairn.report({"step": 0}, checkpoint=Checkpoint.from_directory(directory),
                          checkpoint_upload_mode=CheckpointUploadMode.ASYNC,
                          checkpoint_upload_fn=lambda checkpoint, name: checkpoint)
    handle.wait()


def same_reference_twice(config: dict[str, Any]) -> None:
    """NO_UPLOAD of one directory, reported again after it was updated in place."""
    directory = os.path.join(cairn.get_context().get_storage().run_path, "latest_state")
    os.makedirs(directory, exist_ok=True)
    for step in range(2):
        with open(os.path.join(directory, "state.bin"), "wb") as f:
            f.write(b"step%d" % step)
        cairn.report({"step": step}, checkpoint=Checkpoint(directory),
                     checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD).wait()


def no_upload_disagreeing(config: dict[str, Any]) -> None:
    rank = cairn.get_context().get_world_rank()
    directory = os.path.join(config["target"], f"rank_{rank}")
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "x.bin"), "wb") as f:
        f.write(b"x")
    cairn.report({"step": 0}, checkpoint=Checkpoint(directory),
                 checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD)
    time.sleep(1.0)  # the refusal arrives while the function is still running


def name_over_reference_data(config: dict[str, Any]) -> None:
    directory = os.path.join(cairn.get_context().get_storage().run_path, "ckpt_a")
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "w.bin"), "wb") as f:
        f.write(b"committed")
    cairn.report({"step": 0}, checkpoint=Checkpoint(directory),
                 checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD).wait()
    other = write_checkpoint(tempfile.mkdtemp(), {"w.bin": b"overwritten"})
    cairn.report({"step": 1}, checkpoint=other, checkpoint_dir_name="ckpt_a")
