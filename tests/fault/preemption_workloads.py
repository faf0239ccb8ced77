"""Train functions for the preemption tests: a just-in-time checkpoint on a notice.

Each rank writes ``pid_<attempt>_<rank>`` (its process id) when it starts, so the test can
send it real signals, and ``resumed_<attempt>_<rank>`` (the step it starts at). On a
notice (``cairn.get_preemption_info()`` not None) every rank makes one SYNC report, rank 0
with the checkpoint, as Ray's fault-tolerance guide does; once it returned each rank writes
``jit_<attempt>_<rank>`` (the step and what the info said). ``hold`` (a set of attempts)
makes that attempt wait after its just-in-time checkpoint, or after the notice when
``jit`` is False, for the node to go: the test kills it, or the deadline passes.
``hold_without_notice`` (a set of attempts): the attempt waits at its third step, after
its second step's report, with or without a notice (``holding_<attempt>_<rank>``).
``await_notice`` (a set of attempts): from its second step on, the attempt waits for the
notice (calling ``get_preemption_info()`` on every rank until it comes).
``ray``: each rank also writes ``node_<attempt>_<rank>``, its Ray node's id.
``self_notice`` (a set of attempts): rank 0 sends itself SIGTERM at the attempt's second
step.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from typing import Any

import cairn


def _note(config: dict[str, Any], name: str, value: object) -> None:
    path = os.path.join(config["scratch"], name)
    with open(path + ".tmp", "w") as f:
        f.write(json.dumps(value))
    os.replace(path + ".tmp", path)  # the test never reads half a file


def _checkpoint(step: int) -> cairn.Checkpoint:
    directory = tempfile.mkdtemp()
    with open(os.path.join(directory, "state.json"), "w") as f:
        json.dump({"step": step}, f)
    return cairn.Checkpoint.from_directory(directory)


def just_in_time(config: dict[str, Any]) -> None:
    context = cairn.get_context()
    rank, attempt = context.get_world_rank(), context.get_attempt()
    start = 0
    resumed = cairn.get_checkpoint()
    if resumed is not None:
        with resumed.as_directory() as d, open(os.path.join(d, "state.json")) as f:
            start = json.load(f)["step"] + 1
    _note(config, f"resumed_{attempt}_{rank}", start)
    if config.get("ray"):  # which Ray node the rank runs on, for the drain tests
        import ray

        _note(config, f"node_{attempt}_{rank}", ray.get_runtime_context().get_node_id())
    _note(config, f"pid_{attempt}_{rank}", os.getpid())
    saved = False
    for step in range(start, config["steps"]):
        time.sleep(config.get("step_s", 0.02))
        if rank == 0 and step == start + 1 and attempt in config.get("self_notice", ()):
            os.kill(os.getpid(), signal.SIGTERM)
        if attempt in config.get("hold_without_notice", ()) and step == start + 2:
            _note(config, f"holding_{attempt}_{rank}", step)
            while True:  # after step start + 1's checkpoint, until the node goes
                time.sleep(0.05)
        info = cairn.get_preemption_info()
        while info is None and attempt in config.get("await_notice", ()) and step > start:
            time.sleep(0.05)  # this attempt trains on only once the notice came
            info = cairn.get_preemption_info()
        if info is not None and not saved:
            saved = True
            if config.get("jit", True):
                cairn.report({"step": step, "jit": 1},
                             checkpoint=_checkpoint(step) if rank == 0 else None)
                _note(config, f"jit_{attempt}_{rank}", {
                    "step": step, "ranks": info.preempted_ranks,
                    "nodes": info.preempted_node_ids, "deadline_ms": info.deadline_ms})
            if attempt in config.get("hold", ()):
                while True:  # training on until the node is reclaimed
                    time.sleep(0.05)
            continue
        if step % config.get("every", 5) == 0:
            cairn.report({"step": step, "jit": 0},
                         checkpoint=_checkpoint(step) if rank == 0 else None)
    cairn.report({"step": config["steps"], "jit": 0})


def sigterm_a_forked_child(config: dict[str, Any]) -> None:
    """A process the worker forks (as a data loader does) is not the worker: SIGTERM ends
    it, and the run hears of no preemption."""
    import multiprocessing

    child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(600,))
    child.start()
    os.kill(child.pid, signal.SIGTERM)
    child.join(60)
    _note(config, f"child_exit_{cairn.get_context().get_world_rank()}", child.exitcode)
    cairn.report({"done": 1})
