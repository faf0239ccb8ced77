"""The local backend with real processes: waiting for a worker whose exit watcher has a
high descriptor number, the exit watcher without a pidfd, and RunConfig.worker_env's
PYTHONPATH."""

from __future__ import annotations

import errno
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from multiprocessing.connection import wait
from pathlib import Path

import pytest

import cairn
from cairn import FailureConfig, ScalingConfig, Trainer
from cairn._src.backends.local import LocalBackend, WorkerProcess
from tests.backends.test_lifecycle_review import _is_unreaped_child

RunConfigFactory = Callable[..., cairn.RunConfig]

# A worker stand-in that ignores SIGTERM (a train function stuck in C code, say) and says
# when it is ready for a signal.
_STUBBORN = ("import signal, sys, time\n"
             "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
             "sys.stdout.write('ready\\n'); sys.stdout.flush()\n"
             "time.sleep(600)\n")


def _start(code: str) -> subprocess.Popen[bytes]:
    """A process in a session of its own, as the local backend starts a worker, once it
    printed its first line."""
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                               start_new_session=True)
    assert process.stdout is not None
    assert process.stdout.readline() == b"ready\n"
    return process


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()
    if process.stdout is not None:
        process.stdout.close()


@pytest.fixture
def high_descriptors() -> Iterator[None]:
    """The next descriptors this process opens are numbered past 1023, as in a driver
    with many files and sockets open."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"RLIMIT_NOFILE's hard limit is {hard}")
    if soft != resource.RLIM_INFINITY and soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1200, hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        assert max(held) > 1024
        os.close(held.pop())  # the one the exit watcher takes, past 1023
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_shutdown_ends_a_worker_whose_exit_watcher_is_numbered_past_1023(
        high_descriptors: None) -> None:
    process = _start(_STUBBORN)
    try:
        worker = WorkerProcess(0, process, forward_output=False)
        assert worker.exit_watcher.fileno() > 1023
        backend = LocalBackend(forward_output=False)
        backend.workers = [worker]
        # The worker ignores the SIGTERM: the grace runs out, and the SIGKILL ends it.
        backend.shutdown(grace_s=0.2)
        assert process.returncode == -signal.SIGKILL
    finally:
        _kill_group(process)


def _refuse_pidfd(pid: int, flags: int = 0) -> int:
    raise PermissionError(errno.EPERM, "Operation not permitted (seccomp)")


def test_without_a_pidfd_a_killed_worker_stays_unreaped_until_its_group_is_ended(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # An older container runtime's seccomp profile refuses pidfd_open: the exit watcher
    # falls back to a thread, which must not reap the worker either (its pid, the id of
    # its process group, could then be reused before the group's last signal).
    monkeypatch.setattr(os, "pidfd_open", _refuse_pidfd, raising=False)
    process = _start(_STUBBORN)
    try:
        worker = WorkerProcess(0, process, forward_output=False)
        os.kill(process.pid, signal.SIGKILL)
        assert wait([worker.exit_watcher], 60), "the exit watcher did not fire"
        assert worker.exit_code() == -signal.SIGKILL
        assert "SIGKILL" in worker.describe_exit()
        assert _is_unreaped_child(process.pid), "the worker was reaped before end_group"
        worker.end_group()
        assert not _is_unreaped_child(process.pid)
        assert process.returncode == -signal.SIGKILL
    finally:
        _kill_group(process)


def import_from_worker_env_path(config: dict[str, str]) -> str:
    import importlib

    return str(importlib.import_module(config["module"]).VALUE)


def test_a_pythonpath_in_worker_env_reaches_the_worker(
        run_config: RunConfigFactory, tmp_path: Path) -> None:
    library = tmp_path / "library"
    library.mkdir()
    (library / "cairn_review_worker_env_module.py").write_text("VALUE = 'found'\n")
    result = Trainer(
        import_from_worker_env_path,
        train_loop_config={"module": "cairn_review_worker_env_module"},
        scaling_config=ScalingConfig(num_workers=1),
        run_config=run_config(worker_env={"PYTHONPATH": str(library)},
                              failure_config=FailureConfig(max_failures=0)),
    ).fit()
    assert result.return_value == "found"
