"""The train function of ``bench/dcp.py``: what each of the two gloo ranks runs.

Every side saves the same training state (a DDP-wrapped MLP and its Adam state) and is
timed the same way, on every rank, with the collectives in the same order on both ranks:

* ``call``: the save call, until it returns (the loop may change the state after it);
* ``idle``: call to committed with the loop asleep (each rank waits for its own commit,
  then one all-reduce tells that every rank's has landed);
* ``busy``: call to committed with DDP steps running, the stop decided after each step by
  an all-reduce of "committed here" (so both ranks run the same number of steps);
* ``restore``: a fresh model and Adam (built on the meta device, then ``to_empty``: no
  init kernels) loaded from the checkpoint of the idle save, call to return;
* ``write_bytes`` / ``fsync``: summed over both ranks during the idle save.

Commit times are stamped where the commit is observed (a future's done-callback, a thread
blocked in ``ReportHandle.wait()``), not at the next step boundary. This module needs only
torch, Cairn and the standard library: the workers import it by name.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger("bench.dcp.worker")

CAIRN = "cairn"
DCP_SAVE = "dcp_save"
DCP_ASYNC = "dcp_async"
DCP_CACHED = "dcp_async_cached"
DCP_PROCESS = "dcp_async_process"
SHARDED = "sharded_cairn"
SHARDED_FN = "sharded_cairn_upload_fn"
SIDES = (CAIRN, DCP_SAVE, DCP_ASYNC, DCP_CACHED, DCP_PROCESS, SHARDED, SHARDED_FN)
"""Every way of saving that a round measures; the order alternates between rounds."""

MODEL_DEPTH = 8
BATCH = 16
IDLE_POLL_S = 0.001


# --------------------------------------------------------------------------------------
# Measuring a process tree's writes and fsync calls
# --------------------------------------------------------------------------------------


def _descendants(pid: int) -> list[int]:
    found: list[int] = []
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{current}/task/{task}/children", encoding="ascii") as f:
                    children = [int(c) for c in f.read().split()]
            except OSError:
                continue
            found.extend(children)
            pending.extend(children)
    return found


def write_bytes(trees: Sequence[int], alone: Sequence[int] = ()) -> tuple[int, int]:
    """``(write_bytes, cancelled_write_bytes)`` of ``trees`` with their live descendants,
    and of ``alone`` without them.

    ``/proc/<pid>/io`` counts bytes when pages are dirtied (so at ``write()``, not at
    writeback) and includes the children a process has reaped; live children (DCP's
    checkpoint process, Cairn's copy processes) are read on their own.
    """
    total = cancelled = 0
    members = {m for pid in trees for m in (pid, *_descendants(pid))} | set(alone)
    for member in members:
        try:
            with open(f"/proc/{member}/io", encoding="ascii") as f:
                fields = dict(line.split(": ") for line in f.read().splitlines())
        except (OSError, ValueError):
            continue
        total += int(fields.get("write_bytes", 0))
        cancelled += int(fields.get("cancelled_write_bytes", 0))
    return total, cancelled


class FsyncCounter:
    """Counts ``os.fsync``/``os.fdatasync`` calls made in this process (any thread) while
    installed; ``close()`` puts the originals back."""

    NAMES = ("fsync", "fdatasync")

    def __init__(self) -> None:
        self.calls = 0
        self._lock = threading.Lock()
        self._originals = {name: getattr(os, name) for name in self.NAMES}
        for name, original in self._originals.items():
            setattr(os, name, self._counting(original))

    def _counting(self, original: Callable[[int], None]) -> Callable[[int], None]:
        def counted(fd: Any) -> None:
            with self._lock:
                self.calls += 1
            original(fd)
        return counted

    def close(self) -> None:
        for name, original in self._originals.items():
            setattr(os, name, original)


# --------------------------------------------------------------------------------------
# One save in flight
# --------------------------------------------------------------------------------------


class Pending:
    """A save in flight: ready here (``ready``), committed everywhere (``advance``)."""

    def __init__(self) -> None:
        self.committed = threading.Event()
        self.committed_at: float | None = None
        self.restore_from: Any = None
        # The sharded routes: when DCP's future was done here (its done-callback), so
        # that what Cairn adds after it can be told from DCP's own time.
        self.saved_at: float | None = None

    def stamp_saved(self, future: Any) -> None:
        def done(_: Any) -> None:
            self.saved_at = time.perf_counter()

        future.add_done_callback(done)

    def stamp(self) -> None:
        if self.committed_at is None:
            self.committed_at = time.perf_counter()
        self.committed.set()

    def ready(self) -> bool:
        return self.committed.is_set()

    def wait_ready(self) -> None:
        self.committed.wait()

    def advance(self) -> bool:
        """Called on every rank once every rank is ready; True when the save is done."""
        return True


class Committed(Pending):
    def __init__(self, restore_from: Any) -> None:
        super().__init__()
        self.restore_from = restore_from
        self.stamp()


class FuturePending(Pending):
    def __init__(self, future: Any, restore_from: Any) -> None:
        super().__init__()
        self.restore_from = restore_from
        self.future = future
        future.add_done_callback(lambda _: self.stamp())

    def wait_ready(self) -> None:
        self.future.result()


class HandlePending(Pending):
    """A Cairn ``ReportHandle``: a thread blocked in ``wait()`` stamps the commit."""

    def __init__(self, handle: Any) -> None:
        super().__init__()
        self.handle = handle
        threading.Thread(target=self._watch, name="bench-commit-watch", daemon=True).start()

    def _watch(self) -> None:
        try:
            self.handle.wait()
            self.restore_from = self.handle.checkpoint
        except BaseException:  # advance() re-raises it on the main thread
            pass
        self.stamp()

    def advance(self) -> bool:
        self.handle.wait()  # re-raises a failed commit
        return True


class ShardedPending(Pending):
    """DCP's ``async_save``, then (every rank's future done) a NO_UPLOAD ``report()`` of
    what ``writer`` (``cairn.torch.FileSystemWriter``) wrote."""

    def __init__(self, future: Any, writer: Any, tag: dict[str, Any]) -> None:
        super().__init__()
        self.future, self.writer, self.tag = future, writer, tag
        self.inner: HandlePending | None = None

    def ready(self) -> bool:
        return self.future.done() if self.inner is None else self.inner.ready()

    def wait_ready(self) -> None:
        if self.inner is None:
            self.future.result()
        else:
            self.inner.wait_ready()

    def advance(self) -> bool:
        import cairn

        if self.inner is None:
            self.future.result()
            self.inner = HandlePending(cairn.report(
                self.tag, checkpoint=self.writer.checkpoint(),
                checkpoint_upload_mode=cairn.CheckpointUploadMode.NO_UPLOAD))
            return False
        self.inner.advance()
        self.committed_at = self.inner.committed_at
        self.restore_from = self.inner.restore_from
        return True


class WaitForSave:
    """A ``checkpoint_upload_fn`` (as in ``examples/torch_dcp_async.py``): on Cairn's
    upload thread, wait for DCP's future, then hand over the directory ``writer`` wrote,
    with the checksums it computed."""

    def __init__(self, future: Any, writer: Any) -> None:
        self.future, self.writer = future, writer

    def __call__(self, checkpoint: Any, dir_name: str) -> Any:
        self.future.result()
        return self.writer.checkpoint()


# --------------------------------------------------------------------------------------
# The training state and its saves
# --------------------------------------------------------------------------------------


def model_width(state_mb: float) -> int:
    """The width of the MLP whose parameters and Adam moments take ``state_mb`` MB."""
    parameters = state_mb * 1e6 / 4 / 3
    width = int((parameters / MODEL_DEPTH) ** 0.5)
    return max(16, width - width % 16)


def make_model(width: int, device: str | None = None) -> Any:
    import torch

    layers: list[Any] = []
    for index in range(MODEL_DEPTH):
        layers.append(torch.nn.Linear(width, width, bias=False, device=device))
        if index < MODEL_DEPTH - 1:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


class AppState:
    """Model and optimizer in DCP's Stateful form, as ``examples/torch_dcp_async.py``."""

    def __init__(self, model: Any, optimizer: Any) -> None:
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optimizer_state = get_state_dict(self.model, self.optimizer)
        return {"model": model_state, "optimizer": optimizer_state}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_state_dict

        set_state_dict(self.model, self.optimizer, model_state_dict=state_dict["model"],
                       optim_state_dict=state_dict["optimizer"])


class Rank:
    """One rank's model, optimizer, step, and every side's save and restore."""

    def __init__(self, config: dict[str, Any]) -> None:
        import torch
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        import cairn
        from cairn.torch import prepare_model

        self.torch, self.dist, self.dcp = torch, dist, dcp
        torch.set_num_threads(1)
        self.rank = cairn.get_context().get_world_rank()
        self.width = model_width(float(config["state_mb"]))
        torch.manual_seed(0)
        self.model = prepare_model(make_model(self.width))
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        self.inputs = torch.randn(BATCH, self.width)
        self.flag = torch.zeros(1)
        # DCP's background collectives get a gloo group of their own (never interleaved
        # with DDP's on the default group), as examples/torch_dcp_async.py does.
        self.group = dist.new_group(backend="gloo")
        # No pinned memory, no async staging: both need an accelerator (CPU-only here).
        self.cached_stager = DefaultStager(StagingOptions(False, False, False, False))
        self.shared_stager = DefaultStager(StagingOptions(False, True, False, False))
        self.dcp_root = Path(config["dcp_root"])
        self.saves = 0
        # The sharded routes' directories Cairn may still reference (its latest checkpoint).
        self.references: list[str] = []
        self.step()  # Adam's moments exist before the first save

    def state_bytes(self) -> int:
        tensors = list(self.model.parameters())
        for state in self.optimizer.state.values():
            tensors += [v for v in state.values() if self.torch.is_tensor(v) and v.dim() > 0]
        return sum(t.numel() * t.element_size() for t in tensors)

    def step(self) -> None:
        self.optimizer.zero_grad()
        self.model(self.inputs).pow(2).mean().backward()
        self.optimizer.step()

    def everyone(self, ready: bool) -> bool:
        self.flag.fill_(1.0 if ready else 0.0)
        self.dist.all_reduce(self.flag, op=self.dist.ReduceOp.MIN)
        return bool(self.flag.item() == 1.0)

    def total(self, value: float) -> float:
        tensor = self.torch.tensor([float(value)], dtype=self.torch.float64)
        self.dist.all_reduce(tensor)
        return float(tensor.item())

    def _path(self) -> str:
        self.saves += 1
        return str(self.dcp_root / f"save_{self.saves:04d}")

    def save(self, side: str, tag: dict[str, Any]) -> Pending:
        """Start one save of ``side``; returns when the loop may change the state."""
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

        from cairn.torch import report_snapshot

        state = {"app": AppState(self.model, self.optimizer)}
        if side == CAIRN:
            return HandlePending(report_snapshot(tag, model=self.model,
                                                 optimizer=self.optimizer))
        path = self._path()
        if side == DCP_SAVE:
            self.dcp.save(state, checkpoint_id=path, process_group=self.group)
            return Committed(path)
        if side == DCP_ASYNC:
            future = self.dcp.async_save(state, checkpoint_id=path, process_group=self.group)
        elif side == DCP_CACHED:
            future = self.dcp.async_save(state, checkpoint_id=path, process_group=self.group,
                                         async_stager=self.cached_stager)
        elif side in (SHARDED, SHARDED_FN):
            from cairn.torch import FileSystemWriter

            # DCP's writer, checksumming as it writes: the commit reads nothing again.
            writer = FileSystemWriter(path)
            future = self.dcp.async_save(state, checkpoint_id=path, process_group=self.group,
                                         async_stager=self.cached_stager,
                                         storage_writer=writer)
        elif side == DCP_PROCESS:
            future = self.dcp.async_save(
                state, checkpoint_id=path, process_group=self.group,
                async_checkpointer_type=AsyncCheckpointerType.PROCESS,
                async_stager=self.shared_stager)
        else:
            raise ValueError(f"side={side!r} is not one of {SIDES}")
        if side == SHARDED:
            sharded = ShardedPending(future, writer, tag)
            sharded.stamp_saved(future)
            return sharded
        if side == SHARDED_FN:
            import cairn

            # Reported at the call: Cairn's upload thread waits for the future and registers
            # the directory the moment DCP has written it, not at a step boundary.
            registered = HandlePending(cairn.report(
                tag, checkpoint=cairn.Checkpoint(path),
                checkpoint_upload_mode=cairn.CheckpointUploadMode.ASYNC,
                checkpoint_upload_fn=WaitForSave(future, writer),
                delete_local_checkpoint_after_upload=False))
            registered.stamp_saved(future)
            return registered
        return FuturePending(future, path)

    def restore(self, side: str, restore_from: Any) -> float:
        """Seconds to load ``restore_from`` into a fresh model and Adam (all ranks)."""
        from cairn.torch import load_training_state

        fresh = make_model(self.width, device="meta").to_empty(device="cpu")
        optimizer = self.torch.optim.Adam(fresh.parameters(), lr=1e-4)
        state = {"app": AppState(fresh, optimizer)}
        self.dist.barrier()
        started = time.perf_counter()
        if side == CAIRN:
            load_training_state(restore_from, model=fresh, optimizer=optimizer)
        elif side in (SHARDED, SHARDED_FN):
            with restore_from.as_directory() as directory:
                self.dcp.load(state, checkpoint_id=directory, process_group=self.group)
        else:
            self.dcp.load(state, checkpoint_id=restore_from, process_group=self.group)
        seconds = time.perf_counter() - started
        self.dist.barrier()
        return seconds

    def discard(self, side: str, restore_from: Any) -> None:
        """Delete a DCP directory Cairn does not reference (Cairn prunes its own). A
        sharded route's directory is the user's (Cairn never deletes a reference): it is
        deleted here once a later checkpoint committed (``num_to_keep=1``), so that the
        saves do not pile up gigabytes on the disk and in the page cache."""
        if self.rank != 0:
            return
        if side in (DCP_SAVE, DCP_ASYNC, DCP_CACHED, DCP_PROCESS):
            shutil.rmtree(restore_from, ignore_errors=True)
            return
        if side in (SHARDED, SHARDED_FN) and restore_from is not None:
            path = Path(restore_from.path)
            # The directory DCP wrote, never anything of Cairn's run.
            assert path.parent == self.dcp_root, (path, self.dcp_root)
            self.references.append(str(path))
        # Cairn's latest checkpoint is the one just committed: a sharded save's own
        # directory stays referenced, any older one (or all, after a Cairn snapshot) not.
        latest = self.references[-1:] if side in (SHARDED, SHARDED_FN) else []
        for path in self.references:
            if path not in latest:
                shutil.rmtree(path, ignore_errors=True)
        self.references = latest

    def close(self) -> None:
        self.cached_stager.close()
        self.shared_stager.close()


# --------------------------------------------------------------------------------------
# The train function
# --------------------------------------------------------------------------------------


def settle(worker: Rank) -> None:
    """No dirty pages of the phase before: every phase starts from the same disk state."""
    worker.dist.barrier()
    if worker.rank == 0:
        os.sync()
    worker.dist.barrier()


def run_steps(worker: Rank, stop: Callable[[], bool]) -> list[float]:
    """Step until ``stop()`` (evaluated after every step, on every rank) holds."""
    samples: list[float] = []
    while True:
        started = time.perf_counter()
        worker.step()
        samples.append(time.perf_counter() - started)
        if stop():
            return samples


def countdown(steps: int) -> Callable[[], bool]:
    """A ``stop`` for :func:`run_steps` that holds after ``steps`` steps."""
    left = iter(range(steps - 1))
    return lambda: next(left, None) is None


def timed_save(worker: Rank, side: str, tag: dict[str, Any], busy: bool,
               driver: list[int], fsync: FsyncCounter) -> dict[str, Any]:
    """One save of ``side``: its blocking time, commit time, steps, bytes and fsyncs."""
    settle(worker)
    io_before, fsync_before = write_bytes([os.getpid()], driver), fsync.calls
    started = time.perf_counter()
    pending = worker.save(side, tag)
    returned = time.perf_counter()
    steps: list[float] = []
    if busy:
        steps = run_steps(worker, lambda: worker.everyone(pending.ready())
                          and pending.advance())
    else:
        while True:
            pending.wait_ready()
            worker.everyone(True)
            if pending.advance():
                break
    assert pending.committed_at is not None
    io_after = write_bytes([os.getpid()], driver)
    result = {"call": returned - started, "commit": pending.committed_at - started,
              "steps": steps, "restore_from": pending.restore_from,
              "after_save": None if pending.saved_at is None
              else pending.committed_at - pending.saved_at,
              "saved": None if pending.saved_at is None else pending.saved_at - started}
    if not busy:
        result["write_bytes"] = worker.total(io_after[0] - io_before[0])
        result["cancelled_bytes"] = worker.total(io_after[1] - io_before[1])
        result["fsync"] = worker.total(fsync.calls - fsync_before)
    return result


def train_dcp_comparison(config: dict[str, Any]) -> dict[str, Any]:
    """Rounds of every side (order alternating), with idle step phases between them."""
    fsync = FsyncCounter()
    worker = Rank(config)
    # Rank 0 also counts the driver (Cairn's commit), without its descendants: the workers.
    driver = [int(config["driver_pid"])] if worker.rank == 0 else []
    samples: dict[str, dict[str, list[Any]]] = {side: {} for side in SIDES}
    idle_steps: list[float] = []

    def record(side: str, key: str, value: Any) -> None:
        samples[side].setdefault(key, []).append(value)

    sides = [side for side in SIDES if side in config["sides"]]
    # Warm-up: buffers and stagers allocate, DCP's checkpoint process starts.
    for side in sides:
        warm = timed_save(worker, side, {"round": -1, "side": side}, False, driver, fsync)
        worker.discard(side, warm["restore_from"])
    for number in range(int(config["rounds"])):
        order = sides if number % 2 == 0 else sides[::-1]
        for side in order:
            idle = timed_save(worker, side, {"round": number, "side": side}, False, driver,
                              fsync)
            for key in ("call", "commit", "write_bytes", "cancelled_bytes", "fsync"):
                record(side, key, idle[key])
            if idle["after_save"] is not None:
                record(side, "after_save", idle["after_save"])
                record(side, "saved", idle["saved"])
            record(side, "restore", worker.restore(side, idle["restore_from"]))
            worker.discard(side, idle["restore_from"])
            if side == DCP_SAVE:
                continue  # it blocks: no steps run during it
            settle(worker)
            idle_steps += run_steps(worker, countdown(int(config["idle_steps"])))
            busy = timed_save(worker, side, {"round": number, "side": side, "busy": True},
                              True, driver, fsync)
            record(side, "busy_call", busy["call"])
            record(side, "busy_commit", busy["commit"])
            record(side, "busy_steps", busy["steps"])
            worker.discard(side, busy["restore_from"])
    worker.close()
    fsync.close()
    return {"samples": samples, "idle_steps": idle_steps, "state_bytes": worker.state_bytes(),
            "width": worker.width}
