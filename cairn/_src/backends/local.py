"""The local backend: worker processes on this machine.

A backend only starts worker processes and tells the controller when one dies. Each worker
is a fresh Python interpreter (``python -m cairn._src.worker.main``), so nothing
of the driver's state leaks in; it reads its bootstrap (controller address, per-run secret,
rank) from stdin, never from argv or the environment where other users could see it.

Death is noticed through a pidfd (Linux) that becomes readable the moment the process
exits, waited on together with the workers' connections: no polling interval.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Collection
from multiprocessing.connection import wait
from typing import IO, TYPE_CHECKING, Any

from cairn._src.storage.scratch import SHARED_MEMORY, sweep_stale
from cairn._src.wire.bootstrap import ATTEMPT_VARIABLES, Bootstrap

if TYPE_CHECKING:
    from cairn._src.backends.protocol import WorkerHandle

logger = logging.getLogger(__name__)


class _ExitWatcher:
    """Something ``multiprocessing.connection.wait`` can wait on that fires at exit."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self._process = process
        self._fd: int | None = None
        self._read_fd: int | None = None
        pidfd_open = getattr(os, "pidfd_open", None)
        if pidfd_open is not None:
            try:
                self._fd = pidfd_open(process.pid)
            except OSError:
                self._fd = None
        if self._fd is None:
            # No pidfd (old kernel, a seccomp profile that refuses it, not Linux): a thread
            # waits for the exit, leaving the process unreaped, and writes to a pipe.
            self._read_fd, write_fd = os.pipe()

            def wait_then_signal() -> None:
                _wait_unreaped(process)
                try:
                    os.write(write_fd, b"x")
                except OSError:  # the watcher was closed first (end_group): nobody reads
                    pass
                os.close(write_fd)

            threading.Thread(target=wait_then_signal, name=f"cairn-exit-{process.pid}",
                             daemon=True).start()

    def fileno(self) -> int:
        fd = self.open_fd()
        assert fd is not None
        return fd

    def open_fd(self) -> int | None:
        """The descriptor that fires at exit; None once closed."""
        return self._fd if self._fd is not None else self._read_fd

    def close(self) -> None:
        for fd in (self._fd, self._read_fd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._fd = self._read_fd = None


class WorkerProcess:
    """One worker process of the local backend.

    Its exit is seen without reaping it (:func:`_exit_status`): the zombie keeps its pid,
    which is its process group's id, from being reused until the backend has signalled the
    group for the last time (:meth:`end_group`) and reaped it. A signal to the group of a
    reaped worker whose group has emptied could reach another group that took the pid.
    """

    node_id = "local"
    preempted = False

    def __init__(self, rank: int, process: subprocess.Popen[bytes], forward_output: bool,
                 oom_kills_at_start: int | None = None) -> None:
        self.rank = rank
        self.process = process
        # The OOM killer's count when the worker started (oom_kill_count), or None.
        self._oom_kills_at_start = oom_kills_at_start
        self.exit_watcher = _ExitWatcher(process)
        # Whether end_group ran: its group signalled for the last time, the worker reaped.
        self.group_ended = False
        self._forwarder: threading.Thread | None = None
        if forward_output and process.stdout is not None:
            self._forwarder = threading.Thread(
                target=_forward_output, args=(rank, process.stdout),
                name=f"cairn-output-{rank}", daemon=True,
            )
            self._forwarder.start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def exit_code(self) -> int | None:
        return _exit_status(self.process)

    # The process's exit closed its sockets (a child it forked may hold one open): what it
    # sent is readable when its exit is seen.
    last_message_may_trail = False

    def restart_oom_baseline(self, oom_kills: int | None) -> None:
        """A kept worker (keep_survivors) runs a new attempt: an OOM kill before it, of
        another rank, says nothing about how this one ends."""
        if self.exit_code() is None:
            self._oom_kills_at_start = oom_kills

    def describe_exit(self) -> str:
        code = _exit_status(self.process)
        if code is None:
            return "is still running"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return describe_signal(-code, name, self._oom_kills_at_start, oom_kill_count())
        return f"exited with code {code}"

    def wait_exit(self, timeout: float) -> bool:
        if _exit_status(self.process) is not None:
            return True
        fd = self.exit_watcher.open_fd()
        if fd is None:  # after end_group: reaped
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                return False
            return True
        if timeout > 0:
            # Not select(): it refuses a descriptor numbered past 1023 (a driver with many
            # files open), which left the workers running and failed fit() at its end.
            wait([fd], timeout)
        return _exit_status(self.process) is not None

    def end_group(self, sig: int = signal.SIGKILL) -> None:
        """Signal the worker's process group for the last time (children it started, data
        loaders and helpers, go too), then reap it; once only."""
        if self.group_ended:
            return
        self.group_ended = True
        _signal_group(self.process, sig)
        self.process.wait()
        self.flush_output()
        self.exit_watcher.close()

    def flush_output(self, timeout: float = 2.0) -> None:
        if self._forwarder is not None:
            self._forwarder.join(timeout)


def describe_signal(signum: int, name: str, oom_kills_before: int | None,
                    oom_kills_after: int | None) -> str:
    """How a worker a signal ended was killed (``"was killed by SIGTERM"``).

    A SIGKILL comes from another process (``kill -9``, a job scheduler) or from the
    kernel's OOM killer: it is blamed on memory only when the OOM killer's count
    (:func:`oom_kill_count`) went up while the worker ran.
    """
    if signum != signal.SIGKILL:
        return f"was killed by {name}"
    if oom_kills_before is not None and oom_kills_after is not None and (
            oom_kills_after > oom_kills_before):
        return (f"was killed by {name}: out of memory (the OOM killer; its count went from "
                f"{oom_kills_before} to {oom_kills_after} while the worker ran)")
    return f"was killed by {name}, sent by another process or the kernel's OOM killer"


# Where the OOM killer's count is: cgroup v2, cgroup v1 (both "oom_kill N" lines), and the
# whole kernel's (/proc/vmstat, Linux 4.13+) when this process's cgroup does not say.
_CGROUP_ROOT = "/sys/fs/cgroup"


def oom_kill_count(proc_root: str = "/proc", cgroup_root: str = _CGROUP_ROOT) -> int | None:
    """How many processes the OOM killer has killed in this process's memory cgroup
    (workers are children in the same cgroup), else on the whole machine; None where
    neither can be read (not Linux)."""
    for path in _cgroup_counter_files(proc_root, cgroup_root):
        count = _read_counter(path, "oom_kill")
        if count is not None:
            return count
    return _read_counter(os.path.join(proc_root, "vmstat"), "oom_kill")


def _cgroup_counter_files(proc_root: str, cgroup_root: str) -> list[str]:
    try:
        with open(os.path.join(proc_root, "self", "cgroup")) as f:
            lines = f.read(65536).splitlines()
    except OSError:
        return []
    files = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        relative = path.lstrip("/")
        if controllers == "":
            files.append(os.path.join(cgroup_root, relative, "memory.events"))
        elif "memory" in controllers.split(","):
            files.append(os.path.join(cgroup_root, "memory", relative, "memory.oom_control"))
    # cgroup v1 first: on a hybrid system the v2 hierarchy holds no memory controller.
    return sorted(files, key=lambda p: not p.endswith("memory.oom_control"))


def _read_counter(path: str, key: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read(65536)
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value.strip())
    return None


def _forward_output(rank: int, stream: IO[bytes]) -> None:
    prefix = f"(rank {rank}) ".encode()
    out = sys.stdout.buffer if hasattr(sys.stdout, "buffer") else None
    for line in iter(stream.readline, b""):
        try:
            if out is not None:
                out.write(prefix + line)
                out.flush()
            else:
                sys.stdout.write((prefix + line).decode(errors="replace"))
        except (OSError, ValueError):
            pass
    stream.close()


class LocalBackend:
    """Starts workers as child processes of the driver."""

    name = "local"
    bind_host = "127.0.0.1"

    def __init__(self, *, forward_output: bool = True, env: dict[str, str] | None = None,
                 warm_standby: bool = False) -> None:
        self._forward_output = forward_output
        self._env = env or {}
        self.workers: list[WorkerProcess] = []
        # FailureConfig(warm_standby=True): one spare process per rank, blocked on reading
        # its bootstrap, for the next attempt (see prepare_standby).
        self._warm_standby = warm_standby
        self._standby: list[subprocess.Popen[bytes]] = []
        self._standby_key: tuple[int, tuple[tuple[str, str], ...]] | None = None
        self._last_start: tuple[int, dict[str, str]] | None = None

    def advertise_host(self) -> str:
        return self.bind_host

    def _environment(self, num_workers: int, env: dict[str, str] | None) -> dict[str, str]:
        # Workers import what the driver can import: the train function may be pickled by
        # reference to a module that is only on the driver's sys.path (a script's folder,
        # a test directory).
        # A PYTHONPATH of worker_env comes first, as its own entries come before the
        # installed packages in a process started with it.
        path = [p for p in sys.path if p]
        given = {**self._env, **(env or {})}.get("PYTHONPATH")
        inherited = os.environ.get("PYTHONPATH")
        merged = {**os.environ, **self._env, **(env or {}), "PYTHONUNBUFFERED": "1",
                  "PYTHONPATH": os.pathsep.join(p for p in [given, *path, inherited] if p)}
        merged.setdefault("CAIRN_WORKER", "1")
        return merged

    def _spawn(self, rank: int, num_workers: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
        # The worker starts with SIGTERM blocked (a signal mask survives fork and exec) and
        # unblocks it once its preemption notice handles it: a notice sent while it still
        # imports stays pending instead of killing it (worker/main.py).
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            return subprocess.Popen(
                [sys.executable, "-m", "cairn._src.worker.main"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE if self._forward_output else None,
                stderr=subprocess.STDOUT if self._forward_output else None,
                env={**env, "CAIRN_RANK": str(rank), "CAIRN_WORLD_SIZE": str(num_workers),
                     "CAIRN_LOCAL_RANK": str(rank),
                     "CAIRN_LOCAL_WORLD_SIZE": str(num_workers)},
                start_new_session=True,
            )
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)

    @staticmethod
    def _standby_key_of(num_workers: int, env: dict[str, str]) -> tuple[
            int, tuple[tuple[str, str], ...]]:
        # What a spare must have been started with to serve an attempt: the same size and
        # environment, except what changes every attempt and travels in the bootstrap.
        return num_workers, tuple(sorted((k, v) for k, v in env.items()
                                         if k not in ATTEMPT_VARIABLES))

    def _take_standby(self, num_workers: int, env: dict[str, str]) -> list[
            subprocess.Popen[bytes]] | None:
        spares, self._standby = self._standby, []
        key, self._standby_key = self._standby_key, None
        if not spares:
            return None
        if key != self._standby_key_of(num_workers, env) or any(
                _exit_status(spare) is not None for spare in spares):
            logger.info("The warm standby workers do not fit this attempt (another size or "
                        "environment, or one exited); starting fresh ones")
            _stop_spares(spares)
            return None
        return spares

    def prepare_standby(self) -> None:
        """Start the spares for the next attempt (called at this attempt's first report, so
        that their start-up does not compete with the attempt's own)."""
        if not self._warm_standby or self._last_start is None or self._standby:
            return
        num_workers, env = self._last_start
        self._standby = [self._spawn(rank, num_workers, env) for rank in range(num_workers)]
        self._standby_key = self._standby_key_of(num_workers, env)
        logger.debug("Started %d warm standby workers (pids %s)", num_workers,
                     ", ".join(str(p.pid) for p in self._standby))

    def start(self, num_workers: int, bootstrap: Bootstrap, *,
              env: dict[str, str] | None = None) -> list[WorkerHandle]:
        """Start ``num_workers`` processes; ``env`` adds to their environment.

        With warm standby, the spares started during the previous attempt are handed this
        one (their bootstrap carries ``env``, which they apply before anything reads it).
        """
        merged = self._environment(num_workers, env)
        self._last_start = (num_workers, merged)
        spares = self._take_standby(num_workers, merged) if self._warm_standby else None
        if spares is not None:
            logger.info("Handing attempt %d to %d warm standby workers", bootstrap.attempt,
                        num_workers)
        self.workers = []
        oom_kills = oom_kill_count()
        for rank in range(num_workers):
            process = spares[rank] if spares is not None else self._spawn(rank, num_workers,
                                                                         merged)
            assert process.stdin is not None
            try:
                process.stdin.write(bootstrap.for_rank(rank, env=env or {}))
                process.stdin.close()
            except OSError as exc:
                # The process died before it read its bootstrap (killed right after it was
                # spawned): its exit is that rank's failure, seen by the controller loop
                # like any other, so the attempt fails and restarts within the budget.
                logger.warning("Worker rank %d (pid %d) exited before it read its bootstrap: "
                               "%s", rank, process.pid, exc)
                try:
                    process.stdin.close()
                except OSError:
                    pass
            self.workers.append(WorkerProcess(rank, process, self._forward_output, oom_kills))
        logger.info("Started %d local workers (pids %s)", num_workers,
                    ", ".join(str(w.pid) for w in self.workers))
        return list(self.workers)

    def replace_refusal(self) -> str | None:
        """The local backend always replaces single ranks."""
        return None

    def kill_ranks(self, ranks: Collection[int]) -> None:
        """Kill the processes of ``ranks`` (FailureConfig(keep_survivors=True): the other
        ranks' processes run the next attempt)."""
        for worker in self.workers:
            if worker.rank in ranks:
                worker.end_group()

    def replace(self, ranks: Collection[int], bootstrap: Bootstrap, *,
                env: dict[str, str] | None = None) -> list[WorkerHandle]:
        """A new process for each of ``ranks`` (killed by :meth:`kill_ranks`), handed
        ``bootstrap``; the other ranks' processes stay. Every rank's handle."""
        num_workers = len(self.workers)
        merged = self._environment(num_workers, env)
        # With warm standby, the replacements are spares (their imports done); the unused
        # spares go, and a full set starts again at the next attempt's first report.
        spares = self._take_standby(num_workers, merged) if self._warm_standby else None
        if spares is not None:
            _stop_spares([p for rank, p in enumerate(spares) if rank not in ranks])
        oom_kills = oom_kill_count()
        for rank in sorted(ranks):
            process = (spares[rank] if spares is not None
                       else self._spawn(rank, num_workers, merged))
            assert process.stdin is not None
            try:
                process.stdin.write(bootstrap.for_rank(rank, env=env or {}))
                process.stdin.close()
            except OSError as exc:
                logger.warning("Worker rank %d (pid %d) exited before it read its bootstrap: "
                               "%s", rank, process.pid, exc)
            self.workers[rank] = WorkerProcess(rank, process, self._forward_output, oom_kills)
        for worker in self.workers:
            if worker.rank not in ranks:
                worker.restart_oom_baseline(oom_kills)
        logger.info("Replaced local workers of ranks %s (pids %s); kept pids %s",
                    sorted(ranks), ", ".join(str(self.workers[r].pid) for r in sorted(ranks)),
                    ", ".join(str(w.pid) for w in self.workers if w.rank not in ranks))
        return list(self.workers)

    def shutdown(self, *, grace_s: float = 5.0) -> None:
        """Stop every worker: SIGTERM, then SIGKILL after ``grace_s``; reap them all.

        Each group is signalled while its leader is unreaped, and only by the first call:
        a later one (the run's close after its end) finds nothing to do.
        """
        workers = [w for w in self.workers if not w.group_ended]
        alive = [w for w in workers if w.exit_code() is None]
        if grace_s > 0:
            for worker in alive:
                _signal_group(worker.process, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            for worker in alive:
                worker.wait_exit(max(0.0, deadline - time.monotonic()))
        for worker in workers:
            # Children the worker started (data loaders, its own helpers) go too.
            worker.end_group()
        # A worker killed during a restore (keep_survivors) left its directory of
        # received files in RAM: removed now, not at some later run's restore.
        for base in (SHARED_MEMORY, tempfile.gettempdir()):
            sweep_stale(base)

    def kill(self) -> None:
        self.shutdown(grace_s=0.0)

    def stop_standby(self) -> None:
        """The run is over: its spare processes go too."""
        spares, self._standby = self._standby, []
        self._standby_key = None
        _stop_spares(spares)


def _stop_spares(spares: list[subprocess.Popen[bytes]]) -> None:
    for spare in spares:
        _signal_group(spare, signal.SIGKILL)
    for spare in spares:
        spare.wait()
        for stream in (spare.stdin, spare.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass


def _exit_status(process: subprocess.Popen[Any]) -> int | None:
    """``process.poll()``, without reaping the process: its zombie keeps the pid (the id of
    its process group) reserved until it is reaped after its group's last signal."""
    if process.returncode is not None:
        return process.returncode
    waitid = getattr(os, "waitid", None)
    if waitid is None:
        return process.poll()
    try:
        info = waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped already (end_group)
        return process.poll()
    if info is None:
        return None
    return int(info.si_status) if info.si_code == os.CLD_EXITED else -int(info.si_status)


def _wait_unreaped(process: subprocess.Popen[Any]) -> None:
    """Wait for ``process`` to exit without reaping it where the platform can (see
    :func:`_exit_status`): a reaped worker's pid, its group's id, could be reused before the
    backend signals that group for the last time."""
    waitid = getattr(os, "waitid", None)
    if waitid is None:
        process.wait()
        return
    try:
        waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)
    except ChildProcessError:  # reaped already, by end_group
        pass


def _signal_group(process: subprocess.Popen[Any], sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
