"""A Ray backend's worker: the actor that runs a rank (:class:`WorkerActor`), and the
controller's handle on it (:class:`RayWorker`), whose exit watcher turns the end of the
actor's ``run`` task, however it ends, into a readable pipe."""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any

import ray

logger = logging.getLogger(__name__)


@ray.remote
class WorkerActor:
    def describe(self) -> tuple[int, str, list[str]]:
        """(pid, node id, the ids of the GPUs Ray assigned to this actor)."""
        return (os.getpid(), ray.get_runtime_context().get_node_id(),
                [str(gpu) for gpu in ray.get_gpu_ids()])

    def warm(self, modules: list[str], path: list[str]) -> tuple[int, str, list[str]]:
        """A warm standby spare's imports, done before a rank runs here (ray_standby)."""
        import importlib

        import cairn._src.worker.main  # noqa: F401

        sys.path[:0] = [entry for entry in path if entry not in sys.path]
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception as exc:  # the train function's own import says what is wrong
                logger.debug("Could not preload %s: %s", name, exc)
        return self.describe()

    def run(self, boot: dict[str, Any], env: dict[str, str], path: list[str],
            watch_drain: bool) -> int:
        # Set here rather than in a runtime environment, so that Ray can start the actor
        # in one of its prestarted worker processes (see RayBackend.start).
        os.environ.update(env)
        # The driver's sys.path, so that a train function pickled by reference imports.
        missing = [entry for entry in path if entry not in sys.path]
        sys.path[:0] = missing
        from cairn._src.backends.ray_drain import DrainNotice, drain_poll_s
        from cairn._src.worker.main import run_from_bootstrap

        # A drain of this node is the preemption notice; one worker per node watches, the
        # one the backend picked (RayBackend: local rank 0 at the start, and a replaced
        # rank where no kept rank of its node watches).
        notices = (DrainNotice(ray.get_runtime_context().get_node_id(),
                               drain_poll_s(dict(os.environ)))
                   if watch_drain else None)
        return run_from_bootstrap(boot, notices=notices)


def _node_is_alive(node_id: str) -> bool | None:
    """Whether the cluster still counts ``node_id`` alive; None if it cannot tell."""
    try:
        nodes = ray.nodes()  # type: ignore[no-untyped-call]
    except Exception:
        return None
    for node in nodes:
        if node.get("NodeID") == node_id:
            return bool(node.get("Alive"))
    return False


def _reason(exc: BaseException) -> str:
    """The sentence of a Ray error that says why: "The actor is dead because its node has
    died." rather than its first line, which is the same for every death."""
    text = str(exc)
    marker = text.find("The actor is dead because")
    if marker >= 0:
        sentence = text[marker:].split(". ", 1)[0].split("\n", 1)[0]
        return sentence if sentence.endswith(".") else sentence + "."
    return text.splitlines()[0] if text else ""


class _RefWatcher:
    """A pipe that becomes readable when the actor's ``run`` task ends, however it ends."""

    def __init__(self, ref: Any, name: str, node_id: str) -> None:
        # None once closed. The thread's write and close() hold the lock, so that the
        # thread never writes to an fd number that close() gave back (a run task that
        # returns after kill_ranks stopped waiting for it, its numbers reused meanwhile by
        # a replacement rank's watcher), and a second close() (kill_ranks, then shutdown)
        # closes nothing that was opened since.
        self._lock = threading.Lock()
        self._read_fd: int | None
        self._write_fd: int | None
        self._read_fd, self._write_fd = os.pipe()
        self.outcome: str | None = None
        # The run task's exit code, once it returned (not killed, not lost with its node).
        self.code: int | None = None
        # Ray says the actor died because its node was preempted (RayActorError.preempted:
        # a node drained for preemption, then lost): a preemption, noticed or not.
        self.preempted = False
        self._node_id = node_id
        self._done = threading.Event()
        threading.Thread(target=self._wait, args=(ref,), name=name, daemon=True).start()

    def _wait(self, ref: Any) -> None:
        try:
            code = ray.get(ref)
            self.code = code if isinstance(code, int) else None
            self.outcome = f"exited with code {code}"
        except ray.exceptions.RayActorError as exc:
            self.preempted = bool(getattr(exc, "preempted", False))
            if self.preempted:
                self.outcome = (f"was lost with its Ray node {self._node_id[:12]}, which was "
                                "preempted")
            elif self._node_id and _node_is_alive(self._node_id) is False:
                self.outcome = (f"was lost with its Ray node {self._node_id[:12]} "
                                "(the cluster no longer counts that node alive)")
            else:
                self.outcome = f"died ({type(exc).__name__}: {_reason(exc)})"
        except Exception as exc:
            self.outcome = f"failed ({type(exc).__name__}: {_reason(exc)})"
        self._done.set()
        with self._lock:
            if self._write_fd is not None:
                try:
                    os.write(self._write_fd, b"x")
                except OSError:
                    pass

    def fileno(self) -> int:
        fd = self._read_fd
        if fd is None:
            # Not a number to select on: another file may have it by now.
            raise ValueError("the exit watcher is closed")
        return fd

    def wait(self, timeout: float) -> bool:
        return self._done.wait(timeout)

    def close(self) -> None:
        """Close the pipe; again, nothing. The thread, if still waiting, writes nowhere."""
        with self._lock:
            fds = (self._read_fd, self._write_fd)
            self._read_fd = self._write_fd = None
            for fd in fds:
                if fd is not None:
                    try:
                        os.close(fd)
                    except OSError:
                        pass


class RayWorker:
    def __init__(self, rank: int, actor: Any, ref: Any, pid: int, node_id: str, *,
                 gpu_ids: tuple[str, ...] = (), watches_drain: bool = False) -> None:
        self.rank = rank
        self.actor = actor
        self.node_id = node_id
        # The GPUs Ray assigned to the actor, and whether it watches its node's drain.
        self.gpu_ids = gpu_ids
        self.watches_drain = watches_drain
        self._pid = pid
        self.exit_watcher = _RefWatcher(ref, f"cairn-ray-exit-{rank}", node_id)

    @property
    def pid(self) -> int:
        return self._pid

    def describe_exit(self) -> str:
        return self.exit_watcher.outcome or "is still running"

    @property
    def last_message_may_trail(self) -> bool:
        return self.exit_watcher.code is not None

    @property
    def preempted(self) -> bool:
        """Whether the worker was lost with a node Ray says was preempted."""
        return self.exit_watcher.preempted

    def wait_exit(self, timeout: float) -> bool:
        return self.exit_watcher.wait(timeout)
