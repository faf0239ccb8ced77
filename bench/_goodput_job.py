"""The goodput job: one fixed training job with injected crashes, for both libraries.

:class:`GoodputJob` is the one definition of the job, so that the Cairn side and the Ray
Train reference run the identical workload: same step length, same checkpoint cadence,
same injected crashes, and the same pure definition of "useful"
(:meth:`GoodputJob.summarize`). :func:`goodput_train_loop` is that job's training
function, written once against the Ray-Train-shaped API that both libraries share.

Only the standard library is imported at import time (worker processes of either library
import this module to unpickle the training function); ``bench/_harness.py`` re-exports
everything here.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


@dataclasses.dataclass(frozen=True, kw_only=True)
class GoodputJob:
    """A fixed training job with injected crashes; both sides run exactly this.

    The job is ``num_steps`` steps of ``step_s`` seconds of (sleeping) work, about
    ``duration_s`` of useful work in all. Every ``checkpoint_every_steps`` steps, and
    after the last step, every rank calls ``report()`` with the step in its metrics;
    rank 0 passes a checkpoint (``state.json`` with the step, plus ``checkpoint_mib`` of
    payload; SYNC, or ASYNC with ``async_upload``) and the other ranks pass ``None``.
    Rank ``crash_rank`` calls ``os._exit(1)`` at the start of each step in
    :attr:`crash_steps`, the first time it reaches it (marker files in the work directory
    remember it across restarts). ``crash_at`` is
    in seconds of useful progress and is placed between checkpoints, so each crash loses
    work unless recovery is exact.
    """

    duration_s: float = 60.0
    step_s: float = 0.25
    checkpoint_every_s: float = 5.0
    crash_at: tuple[float, ...] = (22.5, 47.5)
    crash_rank: int = 1
    checkpoint_mib: float = 4.0
    num_workers: int = 2
    # Every rank waits for the others at the end of each step (``<api>.collective.barrier``),
    # as a data-parallel step's gradient all-reduce makes it wait.
    step_barrier: bool = False
    # Rank 0's checkpoints upload in the background (``CheckpointUploadMode.ASYNC``; the
    # library deletes the scratch directory once uploaded) instead of blocking the step.
    async_upload: bool = False

    def __post_init__(self) -> None:
        for name in ("duration_s", "step_s", "checkpoint_every_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"GoodputJob.{name} must be > 0, got {value!r}")
        if self.step_s > self.duration_s:
            raise ValueError(
                f"GoodputJob.step_s ({self.step_s!r}) must not exceed duration_s "
                f"({self.duration_s!r})"
            )
        # Lists arrive from JSON and from configs; keep the dataclass hashable.
        object.__setattr__(self, "crash_at", tuple(float(t) for t in self.crash_at))
        for t in self.crash_at:
            if not 0 < t < self.duration_s:
                raise ValueError(
                    f"GoodputJob.crash_at values must lie in (0, duration_s={self.duration_s!r}),"
                    f" got {t!r}"
                )
        if not 0 <= self.crash_rank < self.num_workers:
            raise ValueError(
                f"GoodputJob.crash_rank must be in [0, num_workers={self.num_workers}), "
                f"got {self.crash_rank!r}"
            )
        if self.checkpoint_mib < 0:
            raise ValueError(f"GoodputJob.checkpoint_mib must be >= 0, got {self.checkpoint_mib!r}")

    @property
    def num_steps(self) -> int:
        return max(1, round(self.duration_s / self.step_s))

    @property
    def checkpoint_every_steps(self) -> int:
        return max(1, round(self.checkpoint_every_s / self.step_s))

    @property
    def crash_steps(self) -> tuple[int, ...]:
        last = self.num_steps - 1
        return tuple(sorted({min(last, round(t / self.step_s)) for t in self.crash_at}))

    @property
    def useful_s(self) -> float:
        """Useful step time of a completed run: every step counted once."""
        return self.num_steps * self.step_s

    def is_checkpoint_step(self, step: int) -> bool:
        return (step + 1) % self.checkpoint_every_steps == 0 or step == self.num_steps - 1

    def to_config(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["crash_at"] = list(self.crash_at)
        return data

    @classmethod
    def from_config(cls, data: Mapping[str, Any]) -> GoodputJob:
        return cls(**dict(data))

    def summarize(self, wall_s: float, executed_steps: Sequence[int]) -> dict[str, Any]:
        """What the run achieved, from its wall time and every step it executed.

        A step is useful once: executing it again after a rollback is lost work, so the
        useful time is ``step_s`` times the number of distinct steps executed. Goodput is
        useful time over wall time. Pure: no clocks, no files.
        """
        if wall_s <= 0:
            raise ValueError(f"wall_s must be > 0, got {wall_s!r}")
        valid = [s for s in executed_steps if 0 <= s < self.num_steps]
        distinct = len(set(valid))
        useful = distinct * self.step_s
        return {
            "wall_s": wall_s,
            "useful_s": useful,
            "goodput": useful / wall_s,
            "steps_executed": len(valid),
            "steps_redone": len(valid) - distinct,
            "redone_s": (len(valid) - distinct) * self.step_s,
            "completed": distinct == self.num_steps,
        }


GOODPUT_JOB = GoodputJob()
"""The full job: a minute of useful steps, a checkpoint every 5 s, two crashes."""

GOODPUT_JOB_QUICK = GoodputJob(duration_s=8.0, checkpoint_every_s=2.0, crash_at=(5.0,))
"""The ``--quick`` job: 8 s of useful steps, a checkpoint every 2 s, one crash halfway
between two checkpoints (short: a restart costs Ray Train several seconds, and the quick
suite stays under five minutes)."""


def goodput_job(quick: bool) -> GoodputJob:
    return GOODPUT_JOB_QUICK if quick else GOODPUT_JOB


def goodput_steps_log(work_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(work_dir) / f"goodput_steps_rank{rank}.log"


def read_goodput_log(work_dir: str | os.PathLike[str], rank: int = 0) -> tuple[list[int], int]:
    """The steps a rank executed, in order, and how many attempts it started."""
    steps: list[int] = []
    attempts = 0
    log = goodput_steps_log(work_dir, rank)
    if not log.exists():
        return steps, attempts
    for line in log.read_text(encoding="utf-8").splitlines():
        kind, _, value = line.partition(" ")
        if kind == "start":
            attempts += 1
        elif kind == "step":
            steps.append(int(value))
    return steps, attempts


def goodput_train_loop(config: Mapping[str, Any]) -> None:
    """The goodput job's training function, for any library with Ray Train's API.

    ``config``: ``job`` (``GoodputJob.to_config()``), ``api`` (the module to import the
    API from: ``"ray.train"`` or ``"cairn"``) and ``work_dir`` (a directory every worker
    can write: step logs, crash markers, scratch checkpoint directories).
    """
    api = importlib.import_module(str(config["api"]))
    collective = importlib.import_module(f"{config['api']}.collective")
    try:
        from _checkpoint_data import make_checkpoint_dir
    except ImportError:  # only the repo root on the path
        from bench._checkpoint_data import make_checkpoint_dir  # type: ignore[no-redef]

    job = GoodputJob.from_config(config["job"])
    work_dir = Path(str(config["work_dir"]))
    rank = int(api.get_context().get_world_rank())

    start = 0
    checkpoint = api.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            state = json.loads(Path(directory, "state.json").read_text(encoding="utf-8"))
        start = int(state["step"]) + 1

    with open(goodput_steps_log(work_dir, rank), "a", encoding="utf-8") as log:
        log.write(f"start {start}\n")
        log.flush()
        for step in range(start, job.num_steps):
            if rank == job.crash_rank and step in job.crash_steps:
                marker = work_dir / f"crashed_at_step_{step}"
                if not marker.exists():
                    marker.touch()
                    log.flush()
                    os._exit(1)
            time.sleep(job.step_s)
            if job.step_barrier:
                collective.barrier()
            log.write(f"step {step}\n")
            log.flush()
            if not job.is_checkpoint_step(step):
                continue
            metrics = {"step": step}
            if rank != 0:
                api.report(metrics, checkpoint=None)
                continue
            scratch = tempfile.mkdtemp(prefix=f"goodput_step{step}_", dir=work_dir)
            try:
                Path(scratch, "state.json").write_text(json.dumps({"step": step}), encoding="utf-8")
                if job.checkpoint_mib > 0:
                    make_checkpoint_dir(scratch, job.checkpoint_mib, num_files=1)
                if job.async_upload:
                    api.report(metrics, checkpoint=api.Checkpoint.from_directory(scratch),
                               checkpoint_upload_mode=api.CheckpointUploadMode.ASYNC)
                    continue  # deleted once uploaded
                api.report(metrics, checkpoint=api.Checkpoint.from_directory(scratch))
            except BaseException:
                shutil.rmtree(scratch, ignore_errors=True)
                raise
            shutil.rmtree(scratch, ignore_errors=True)
