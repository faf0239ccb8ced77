"""One rank of two killed (``kill -9``) during training: crash to the first step after
restore with ``FailureConfig(keep_survivors=True)`` (the survivor keeps its process, only
the killed rank starts afresh) against today's whole-group restart, in one run, at each
training-state size. Run through ``bench/torch_recovery.py --survivors``.

Each rank holds a model whose state is ``size`` MiB (one large parameter, rank 0 writes
it: ``report_snapshot``, waited on) and a small layer trained with one gloo
``all_reduce`` per step. One checkpoint is committed at step 1; at step 3 rank 1 waits
:data:`CRASH_DELAY_S` (the spares of warm standby, started at the checkpoint's report, are
ready by then, as they are for a crash that does not follow the first checkpoint within a
second), then writes the wall time and SIGKILLs itself while rank 0 waits in that step's
``all_reduce``. The
next attempt writes the wall time once rank 0 has restored the checkpoint and both ranks
completed one ``all_reduce`` step. Also measured: the bytes the restore read from storage,
summed over ranks: with keep_survivors from the event log's ``restored`` records (the
survivor restores from its memory copy, the replacement from the survivor's); for the
whole-group restart, every file each rank restored (all from storage); and the
survivor's peak memory (``ru_maxrss`` of its process once it restored), printed per run.

With ``--warm-standby`` both sides above use warm standby, and a third side is measured
in the same run: today's whole-group restart with Cairn's defaults (no warm standby), the
reference of the issue's target; a row gives keep_survivors against each. Each run prints
where its recovery's time went: detection, stop and replace, connect, setup, then per
rank the model build, the restore and (the replacement) the peer transfer.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

import cairn

CRASH_AT = 3
CHECKPOINT_AT = 1
CRASH_DELAY_S = 4.0


def _write(path: str, value: Any) -> None:
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(value, f)
    os.replace(path + ".tmp", path)


def train(config: dict[str, Any]) -> None:
    import resource
    import signal

    import torch
    import torch.distributed as dist

    import cairn.torch as ct

    context = cairn.get_context()
    rank, attempt = context.get_world_rank(), context.get_attempt()
    _write(os.path.join(config["out"], f"entered_{rank}"), time.time())
    torch.manual_seed(0)
    model = torch.nn.Module()
    model.big = torch.nn.Parameter(torch.zeros(config["size_mib"] * 2**18),
                                   requires_grad=False)
    model.small = torch.nn.Linear(64, 1)
    optimizer = torch.optim.SGD(model.small.parameters(), lr=0.01)
    start = 0
    _write(os.path.join(config["out"], f"built_{rank}"), time.time())
    checkpoint = cairn.get_checkpoint()
    if checkpoint is not None:
        manifest = checkpoint.get_manifest()
        assert manifest is not None
        # A restore from storage verifies (reads) every file of the checkpoint.
        read = sum(entry.size for entry in manifest.files.values())
        start = ct.load_training_state(checkpoint, model=model, optimizer=optimizer).step + 1
        _write(os.path.join(config["out"], f"read_{rank}"), read)
        _write(os.path.join(config["out"], f"restored_{rank}"), time.time())
        # The process's peak memory so far (KiB): a kept rank's includes its restore.
        _write(os.path.join(config["out"], f"peak_{rank}"),
               resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    data = torch.randn(32, 64)
    for step in range(start, CRASH_AT + 3):
        optimizer.zero_grad()
        loss = model.small(data).pow(2).mean()
        loss.backward()
        if attempt == 0 and step == CRASH_AT and rank == 1:
            # Rank 0 waits in this step's all_reduce meanwhile. A crash comes seconds
            # after the last checkpoint, not within the second after the first one, when
            # the warm standby spares (started at that report) are still importing torch.
            time.sleep(CRASH_DELAY_S)
            # The crash is the kill: the wait before it is not part of the recovery.
            _write(os.path.join(config["out"], "crash"), time.time())
            os.kill(os.getpid(), signal.SIGKILL)
        total = loss.detach().clone()
        dist.all_reduce(total)
        optimizer.step()
        if attempt > 0 and step == start and rank == 0:
            _write(os.path.join(config["out"], "first_step"), time.time())
        if attempt == 0 and step == CHECKPOINT_AT:
            ct.report_snapshot({"step": step}, model=model, optimizer=optimizer,
                               step=step).wait()


def one_run(keep: bool, size_mib: int, scratch: str, standby: bool,
            label: str = "") -> tuple[float, int]:
    from cairn.torch import TorchTrainer

    out = tempfile.mkdtemp(dir=scratch)
    result = TorchTrainer(
        train, train_loop_config={"size_mib": size_mib, "out": out},
        scaling_config=cairn.ScalingConfig(num_workers=2),
        run_config=cairn.RunConfig(
            name="torch-survivors", storage_path=os.path.join(out, "storage"), progress=0,
            failure_config=cairn.FailureConfig(max_failures=1, keep_survivors=keep,
                                               warm_standby=standby)),
    ).fit()

    def read(name: str) -> Any:
        with open(os.path.join(out, name), encoding="utf-8") as f:
            return json.load(f)

    seconds = float(read("first_step") - read("crash"))
    storage_bytes = sum(read(f"read_{rank}") for rank in (0, 1))
    if keep:
        restored = [e for e in _events(result.path) if e["type"] == "restored"]
        assert len(restored) == 2, restored
        storage_bytes = sum(int(e["bytes"]) for e in restored)
        sources = ", ".join(f"rank {e['rank']}: {e['kind']} in {e['seconds']:.2f}s"
                            + (" (prefetched)" if e.get("prefetched") else "")
                            for e in restored)
        print(f"keep_survivors {size_mib} MiB: {seconds:.2f}s, restored from {sources}, "
              f"{storage_bytes} bytes from storage; the survivor's peak RSS "
              f"{read('peak_0') / 2**20:.2f} GiB", flush=True)
    side = label or ("keep" if keep else "whole")
    print(f"{side} {size_mib} MiB: {seconds:.2f}s; {_breakdown(result.path, read)}",
          flush=True)
    shutil.rmtree(out, ignore_errors=True)
    return seconds, storage_bytes


def _breakdown(path: str, read: Any) -> str:
    """Where the recovery's time went, from the event log and the marks of the run."""
    events = _events(path)
    failure = next(e["t"] for e in events if e["type"] == "failure")
    start = [e["t"] for e in events if e["type"] == "attempt_start"][-1]
    ready = [e["t"] for e in events if e["type"] == "workers_ready"][-1]
    train = [e["t"] for e in events if e["type"] == "train_start"][-1]
    restored = max(read(f"restored_{rank}") for rank in (0, 1))
    marks = [("detect", read("crash"), failure), ("stop, replace", failure, start),
             ("connect", start, ready), ("setup", ready, train),
             ("model, restore", train, restored), ("first step", restored,
                                                  read("first_step"))]
    # The peer transfer (from the event log): with a prefetch it ran from the worker's
    # setup, beside the model build, and only its rest is on the restore's path.
    peer = {e["rank"]: e for e in events if e["type"] == "restored"
            and int(e.get("peer_bytes") or 0) > 0}
    ranks = "; ".join(
        f"rank {rank}: enter {read(f'entered_{rank}') - train:.2f}, model built "
        f"{read(f'built_{rank}') - read(f'entered_{rank}'):.2f}, restore "
        f"{read(f'restored_{rank}') - read(f'built_{rank}'):.2f}"
        + (f", from the peer transfer's start to restored {peer[rank]['seconds']:.2f}"
           + (" (prefetched)" if peer[rank].get("prefetched") else "")
           if rank in peer else "") for rank in (0, 1))
    return ", ".join(f"{name} {end - begin:.2f}" for name, begin, end in marks) + (
        f" ({ranks})")


def _events(path: str) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    directory = os.path.join(path, "events")
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), encoding="utf-8") as f:
            records += [json.loads(line) for line in f if line.strip()]
    return records


def _against_defaults(size: int, runs: int, kept: list[float],
                      today: list[float]) -> dict[str, Any]:
    """The row against today's whole-group restart (Cairn's defaults: no warm standby)."""
    cairn_s, reference = statistics.median(kept), statistics.median(today)
    return {
        "benchmark": "torch_survivors",
        "metric": f"crash of 1 of 2 ranks to first step after restore, {size} MiB state, "
                  "keep_survivors, warm standby",
        "cairn": cairn_s, "reference": reference, "ratio": cairn_s / reference, "unit": "s",
        "reference_name": "whole-group restart with Cairn's defaults (no warm standby), "
                          "same run",
        "note": f"median of {runs}; kept {', '.join(f'{t:.2f}' for t in kept)} s, whole "
                f"(defaults) {', '.join(f'{t:.2f}' for t in today)} s; target <= 0.3x",
    }


def run_survivors(args: Any) -> list[dict[str, Any]]:
    runs = getattr(args, "runs", None) or (1 if getattr(args, "quick", False) else 3)
    sizes = [int(s) for s in str(getattr(args, "sizes_mib", "64,1024")).split(",") if s]
    standby = bool(getattr(args, "warm_standby", False))
    scratch = tempfile.mkdtemp(prefix="cairn-bench-torch-survivors-")
    rows: list[dict[str, Any]] = []
    kept_median: dict[int, float] = {}
    try:
        for size in sizes:
            whole, kept, today, whole_bytes, kept_reads = [], [], [], 0, []
            for _ in range(runs):  # alternate, so that load drifts hit all sides alike
                seconds, whole_bytes = one_run(False, size, scratch, standby)
                whole.append(seconds)
                seconds, read = one_run(True, size, scratch, standby)
                kept.append(seconds)
                kept_reads.append(read)
                if standby:  # today's whole-group restart: Cairn's defaults
                    today.append(one_run(False, size, scratch, False, "whole, defaults")[0])
            kept_bytes = max(kept_reads)
            cairn_s, reference = statistics.median(kept), statistics.median(whole)
            kept_median[size] = cairn_s
            rows.append({
                "benchmark": "torch_survivors",
                "metric": f"crash of 1 of 2 ranks to first step after restore, {size} MiB "
                          f"state, keep_survivors{', warm standby' if standby else ''}",
                "cairn": cairn_s, "reference": reference, "ratio": cairn_s / reference,
                "unit": "s", "reference_name": "whole-group restart, same run"
                + (" (warm standby too)" if standby else ""),
                "note": f"median of {runs}; kept {', '.join(f'{t:.2f}' for t in kept)} s, "
                        f"whole {', '.join(f'{t:.2f}' for t in whole)} s; restore read "
                        f"{kept_bytes / 2**10:.0f} KiB (kept) and {whole_bytes / 2**20:.0f} "
                        "MiB (whole) from storage",
            })
            if standby:
                rows.append(_against_defaults(size, runs, kept, today))
            # Each rank of the whole-group restart read the whole checkpoint.
            rows.append({
                "benchmark": "torch_survivors",
                "metric": f"bytes read from storage on a single-rank crash, {size} MiB state, "
                          "keep_survivors",
                "cairn": kept_bytes, "reference": whole_bytes // 2,
                "ratio": kept_bytes / (whole_bytes // 2), "unit": "B",
                "reference_name": "checkpoint size",
                "note": f"most of {runs} runs, both ranks; target 0",
            })
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if len(sizes) > 1:
        small, large = min(sizes), max(sizes)
        rows.append({
            "benchmark": "torch_survivors",
            "metric": f"keep_survivors recovery, {large} MiB against {small} MiB state",
            "cairn": kept_median[large], "reference": kept_median[small],
            "ratio": kept_median[large] / kept_median[small], "unit": "s",
            "reference_name": f"{small} MiB, same run", "note": "target: flat in size (<= 1.3x)",
        })
    return rows
