"""Train functions for FailureConfig(keep_survivors=True), run in real worker processes."""

from __future__ import annotations

import json
import os
import random
import signal
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import cairn
from cairn.torch import load_training_state, prepare_data_loader, prepare_model, report_snapshot


def _data() -> TensorDataset:
    generator = torch.Generator().manual_seed(1234)
    inputs = torch.randn(64, 8, generator=generator)
    return TensorDataset(inputs, (inputs.sum(dim=1) > 0).long())


def _record(config: dict[str, Any], name: str, value: Any) -> None:
    path = os.path.join(config["scratch"], name)
    with open(path + ".tmp", "w") as f:
        json.dump(value, f)
    os.replace(path + ".tmp", path)


def train(config: dict[str, Any]) -> dict[str, Any]:
    """A DDP model trained with an explicit all_reduce each step, snapshotted every
    ``every`` steps. ``faults`` maps an attempt to what one rank does at one step: "kill"
    (SIGKILL while its peers wait in the step's all_reduce) or "raise"; with "corrupt"
    (a rank), that rank first changes its memory copy of the checkpoint (the snapshot's
    buffers), as a bit flip would. Kind "kill_while_serving": the rank, kept into that
    attempt, SIGKILLs itself in the middle of sending its memory copy to a replacement
    rank, once that rank's train function restores (``ballast_mib`` of extra state makes
    that copy large): the file's bytes with ``"route": "file"``, else once that rank
    mapped the copy in shared memory. Kind "lose_node" (Ray backend): every rank records
    its node; the highest rank off the head node (``fault["head"]``) holds there for its node to be
    removed, the others go on into the step's all_reduce. Kind "kill_after_snapshot": the
    rank SIGKILLs itself 0.3 s after its ``report_snapshot`` of step ``after_step``."""
    context = cairn.get_context()
    rank, attempt = context.get_world_rank(), context.get_attempt()
    _record(config, f"pid_{attempt}_{rank}.json", os.getpid())
    torch.manual_seed(0)
    random.seed(rank)
    np.random.seed(rank)
    model = prepare_model(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2),
                                        nn.Linear(16, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loader = prepare_data_loader(DataLoader(_data(), batch_size=4, shuffle=True), seed=3)
    step = 0
    checkpoint = cairn.get_checkpoint()
    fault = config.get("faults", {}).get(str(attempt))
    for later, planned in config.get("faults", {}).items():
        if (int(later) > attempt and planned["kind"] == "kill_while_serving"
                and planned["rank"] == rank):
            _kill_while_serving(config, int(later), rank)
    if checkpoint is not None:
        _record(config, f"restoring_{attempt}_{rank}.json", True)
        step = load_training_state(checkpoint, model=model, optimizer=optimizer,
                                   data_loader=loader).step
        _record(config, f"resumed_{attempt}_{rank}.json", step)
    ballast = ({"ballast": torch.ones(config["ballast_mib"] * 2**18)}
               if config.get("ballast_mib") else None)
    handles: list[cairn.ReportHandle] = []
    for _ in range(loader.epoch, config["epochs"]):
        for inputs, labels in loader:
            noise = random.random() * 0.01 + float(np.random.rand()) * 0.01
            loss = nn.functional.cross_entropy(model(inputs + noise), labels)
            optimizer.zero_grad()
            loss.backward()
            if fault and fault.get("corrupt") == rank and step + 1 == fault["step"]:
                for handle in handles:
                    handle.wait()
                _corrupt_memory_copy()
            if fault and fault["kind"] == "lose_node" and step + 1 == fault["step"]:
                for handle in handles:
                    handle.wait()
                _hold_if_lost(config, fault, rank, context.get_world_size())
            elif fault and rank == fault.get("rank") and step + 1 == fault.get("step"):
                for handle in handles:
                    handle.wait()  # the resume is from a committed checkpoint
                if fault["kind"] == "raise":
                    raise ValueError(f"rank {rank} fails on purpose at step {step + 1}")
                time.sleep(0.3)  # the peers are inside this step's all_reduce by now
                os.kill(os.getpid(), signal.SIGKILL)
            total = loss.detach().clone()
            dist.all_reduce(total)
            optimizer.step()
            step += 1
            if step % config["every"] == 0:
                handles.append(report_snapshot({"step": step, "loss": float(total)},
                                               model=model, optimizer=optimizer,
                                               data_loader=loader, step=step,
                                               extra=ballast))
                if (fault and fault["kind"] == "kill_after_snapshot"
                        and rank == fault["rank"] and step == fault["after_step"]):
                    # Its part of the report is sent (its own small file is on storage:
                    # under load its background upload can take longer than any fixed
                    # wait); the other rank is still writing its snapshot, so the commit
                    # is in flight when the failure is seen.
                    _wait_for_own_part(handles[-1].index, rank)
                    time.sleep(0.3)
                    os.kill(os.getpid(), signal.SIGKILL)
    for handle in handles:
        handle.wait()
    final = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    return {"step": step, "model": {k: v.clone() for k, v in final.state_dict().items()},
            "next_draw": torch.rand(2)}


def _wait_for_own_part(index: int, rank: int) -> None:
    from cairn._src.worker.session import get_session

    part = get_session("test")._setup.run.join(f"checkpoint_{index:06d}",
                                                 f"rank_{rank}", "rank_state.pt")
    deadline = time.monotonic() + 120
    while not os.path.exists(part.path) and time.monotonic() < deadline:
        time.sleep(0.01)


def _hold_if_lost(config: dict[str, Any], fault: dict[str, Any], rank: int,
                  world_size: int) -> None:
    import ray

    _record(config, f"node_{rank}.json", ray.get_runtime_context().get_node_id())
    for other in range(world_size):
        _wait_for(config, f"node_{other}.json")
    nodes = [_read(config, f"node_{other}.json") for other in range(world_size)]
    lost = max(r for r in range(world_size) if nodes[r] != fault["head"])
    if rank == lost:
        _record(config, "holding.json", rank)
        while True:  # until this node is removed
            time.sleep(1)


def _read(config: dict[str, Any], name: str) -> Any:
    with open(os.path.join(config["scratch"], name)) as f:
        return json.load(f)


def _corrupt_memory_copy() -> None:
    from cairn._src.torch.snapshot import snapshot_buffers

    pool = snapshot_buffers()
    with pool._lock:
        held = [s for s in pool._sets if s.held]
    assert held, "no memory copy is held"
    for buffer_set in held:
        for tensor in buffer_set.tensors.values():
            if tensor.is_floating_point():
                tensor.add_(1.0)


def _wait_mapped_elsewhere(inode: int) -> None:
    """Until another process maps the shared-memory file ``inode`` (or 60 s)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            if int(pid) == os.getpid():
                continue
            try:
                with open(f"/proc/{pid}/maps") as maps:
                    if any(line.split()[4:5] == [str(inode)] and "memfd:" in line
                           for line in maps):
                        return
            except OSError:
                continue
        time.sleep(0.01)


def _kill_while_serving(config: dict[str, Any], attempt: int, rank: int) -> None:
    """From now on, this process (rank ``rank`` of 2) SIGKILLs itself once it has sent
    1 MiB of a file of its memory copy to a peer in ``attempt`` that is restoring (over
    the socket, or into the peer's file on this machine)."""
    from cairn._src.worker import memory_copy

    send = memory_copy._send_file
    if getattr(send, "kills", False):
        return
    answer = memory_copy.answer_mapped
    if config["faults"][str(attempt)].get("route") == "file":
        # As a peer whose copy is not in shared memory: the file's bytes are sent.
        memory_copy.answer_mapped = lambda connection, writer, names: connection.send(())
    else:
        def answer_then_die(connection: Any, writer: Any, names: Any) -> None:
            # Dies once the peer mapped its shared memory, before the peer verified it.
            _wait_for(config, f"restoring_{attempt}_{1 - rank}.json")

            class Dying:
                def send(self, value: Any) -> None:
                    connection.send(value)
                    _wait_mapped_elsewhere(value[0][3])
                    os.kill(os.getpid(), signal.SIGKILL)

            answer(Dying(), writer, names)

        memory_copy.answer_mapped = answer_then_die

    def send_then_die(connection: Any, copy: Any, rel: str, offer: object) -> Any:
        # Once the replacement's train function restores (past the model's set-up).
        _wait_for(config, f"restoring_{attempt}_{1 - rank}.json")

        class Dying:
            def __init__(self, sink: Any) -> None:
                self.sink, self.sent = sink, 0

            def write(self, data: Any) -> int:
                written = self.sink.write(data)
                self.sent += written
                if self.sent > 2**20:
                    os.kill(os.getpid(), signal.SIGKILL)
                return int(written)

            def __getattr__(self, name: str) -> Any:
                return getattr(self.sink, name)

        class DyingWriter:
            def write_file(self, name: str, sink: Any) -> None:
                copy.writer.write_file(name, Dying(sink))

        class DyingCopy:
            writer = DyingWriter()

        return send(connection, DyingCopy(), rel, offer)

    send_then_die.kills = True  # type: ignore[attr-defined]
    memory_copy._send_file = send_then_die


def _wait_for(config: dict[str, Any], name: str) -> None:
    deadline = time.time() + 60
    while not os.path.exists(os.path.join(config["scratch"], name)):
        if time.time() > deadline:
            raise TimeoutError(f"{name} did not appear")
        time.sleep(0.01)
