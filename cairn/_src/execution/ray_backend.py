"""The Ray backend: workers are actors on a Ray cluster, placed by a placement group.

Each actor runs the same worker runtime as a local worker process and connects back to
the controller over TCP with the run's secret. An actor's death (a crash, ``ray.kill``,
a lost node, the memory monitor) surfaces as the failure of its ``run`` task, which a
thread per worker waits on and turns into a readable pipe for the controller: no polling.

The driver's ``sys.path`` travels in ``PYTHONPATH`` so that a train function pickled by
reference imports in the actor, as with the local backend; on a multi-node cluster ship
the code with Ray's ``runtime_env`` (``ray.init(runtime_env={"working_dir": ...})``).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from cairn._src.config import ScalingConfig
from cairn._src.execution.backend import WorkerHandle
from cairn._src.execution.local_backend import Bootstrap

logger = logging.getLogger("cairn.ray_backend")


@ray.remote
class _WorkerActor:
    def describe(self) -> tuple[int, str]:
        return os.getpid(), ray.get_runtime_context().get_node_id()

    def run(self, boot: dict[str, Any]) -> int:
        from cairn._src.execution.worker_main import run_from_bootstrap

        return run_from_bootstrap(boot)


class _RefWatcher:
    """A pipe that becomes readable when the actor's ``run`` task ends, however it ends."""

    def __init__(self, ref: Any, name: str) -> None:
        self._read_fd, self._write_fd = os.pipe()
        self.outcome: str | None = None
        self._done = threading.Event()
        threading.Thread(target=self._wait, args=(ref,), name=name, daemon=True).start()

    def _wait(self, ref: Any) -> None:
        try:
            code = ray.get(ref)
            self.outcome = f"exited with code {code}"
        except ray.exceptions.RayActorError as exc:
            self.outcome = f"died ({type(exc).__name__}: {str(exc).splitlines()[0]})"
        except Exception as exc:
            self.outcome = f"failed ({type(exc).__name__}: {str(exc).splitlines()[0]})"
        self._done.set()
        try:
            os.write(self._write_fd, b"x")
        except OSError:
            pass

    def fileno(self) -> int:
        return self._read_fd

    def wait(self, timeout: float) -> bool:
        return self._done.wait(timeout)

    def close(self) -> None:
        for fd in (self._read_fd, self._write_fd):
            try:
                os.close(fd)
            except OSError:
                pass


class RayWorker:
    def __init__(self, rank: int, actor: Any, ref: Any, pid: int, node_id: str) -> None:
        self.rank = rank
        self.actor = actor
        self.node_id = node_id
        self._pid = pid
        self.exit_watcher = _RefWatcher(ref, f"cairn-ray-exit-{rank}")

    @property
    def pid(self) -> int:
        return self._pid

    def describe_exit(self) -> str:
        return self.exit_watcher.outcome or "is still running"

    def wait_exit(self, timeout: float) -> bool:
        return self.exit_watcher.wait(timeout)


class RayBackend:
    """Starts workers as Ray actors; connects to a running cluster or starts a local one."""

    name = "ray"
    bind_host = "0.0.0.0"

    def __init__(self, scaling: ScalingConfig, *, env: dict[str, str] | None = None) -> None:
        self._scaling = scaling
        self._env = env or {}
        self.workers: list[RayWorker] = []
        self._group: Any = None

    def advertise_host(self) -> str:
        self._ensure_ray()
        return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]

    @staticmethod
    def _ensure_ray() -> None:
        if not ray.is_initialized():
            # RAY_ADDRESS (or a running local cluster) is used when set; otherwise Ray
            # starts a cluster on this machine.
            ray.init(log_to_driver=True)

    def _bundle(self) -> dict[str, float]:
        if self._scaling.resources_per_worker:
            bundle = dict(self._scaling.resources_per_worker)
        else:
            bundle = {"CPU": 1.0}
            if self._scaling.use_gpu:
                bundle["GPU"] = 1.0
        # accelerator_type travels as Ray Train's custom resource, so the placement group
        # only lands on nodes that have that accelerator.
        bundle.update(self._scaling.additional_resources_per_worker)
        return bundle

    def start(self, num_workers: int, bootstrap: Bootstrap, *,
              env: dict[str, str] | None = None) -> list[WorkerHandle]:
        self._ensure_ray()
        bundle = self._bundle()
        self._group = placement_group([bundle] * num_workers,
                                      strategy=self._scaling.placement_strategy)
        ray.get(self._group.ready())
        path = os.pathsep.join(p for p in sys.path if p)
        base_env = {**self._env, **(env or {}), "PYTHONUNBUFFERED": "1", "PYTHONPATH": path,
                    "CAIRN_WORKER": "1", "CAIRN_WORLD_SIZE": str(num_workers)}
        actors = []
        for rank in range(num_workers):
            options: dict[str, Any] = {
                "num_cpus": bundle.get("CPU", 0.0),
                "num_gpus": bundle.get("GPU", 0.0),
                "resources": {k: v for k, v in bundle.items() if k not in ("CPU", "GPU")},
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    placement_group=self._group, placement_group_bundle_index=rank),
                "runtime_env": {"env_vars": {**base_env, "CAIRN_RANK": str(rank)}},
                "max_restarts": 0,
            }
            actors.append(_WorkerActor.options(**options).remote())  # type: ignore[attr-defined]
        described = ray.get([actor.describe.remote() for actor in actors])
        self.workers = []
        for rank, (actor, (pid, node_id)) in enumerate(zip(actors, described, strict=True)):
            ref = actor.run.remote(bootstrap.body(rank))
            self.workers.append(RayWorker(rank, actor, ref, pid, node_id))
        logger.info("Started %d Ray workers on %d nodes", num_workers,
                    len({w.node_id for w in self.workers}))
        return list(self.workers)

    def shutdown(self, *, grace_s: float = 5.0) -> None:
        for worker in self.workers:
            if not worker.wait_exit(grace_s if grace_s > 0 else 0.0):
                ray.kill(worker.actor, no_restart=True)
        for worker in self.workers:
            ray.kill(worker.actor, no_restart=True)
            worker.wait_exit(10.0)
            worker.exit_watcher.close()
        self.workers = []
        if self._group is not None:
            remove_placement_group(self._group)
            self._group = None

    def kill(self) -> None:
        self.shutdown(grace_s=0.0)
