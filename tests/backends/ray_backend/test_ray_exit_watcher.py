"""The Ray backend's exit watcher, with ``ray.get`` stood in for: no Ray cluster.

Its thread blocks in ``ray.get`` on the actor's ``run`` task and writes to a pipe when
that returns. A close while the thread still waits (kill_ranks past its wait) must stop
that write, and a second close (kill_ranks, then shutdown) must not close fd numbers
that something else opened since: a replacement rank's watcher, a file, a socket."""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Iterator

import pytest

ray = pytest.importorskip("ray")

from cairn._src.backends import ray_worker  # noqa: E402


class _BlockingGet:
    """A ``ray.get`` that blocks until released, then returns ``code``."""

    def __init__(self, code: int = 0) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self._code = code

    def __call__(self, ref: object, *args: object, **kwargs: object) -> int:
        self.entered.set()
        assert self.release.wait(30.0), "the test never released ray.get"
        return self._code


@pytest.fixture
def blocking_get(monkeypatch: pytest.MonkeyPatch) -> Iterator[_BlockingGet]:
    get = _BlockingGet()
    monkeypatch.setattr(ray_worker.ray, "get", get)
    yield get
    get.release.set()  # no watcher thread left blocked past the test


def _thread(name: str) -> threading.Thread:
    [thread] = [t for t in threading.enumerate() if t.name == name]
    return thread


def _pipe_at(fds: tuple[int, int]) -> tuple[int, int]:
    """A new pipe whose ends have the fd numbers ``fds`` (free now): what the next
    ``os.pipe()`` or ``open()`` in the process would most likely get anyway."""
    read_fd, write_fd = os.pipe()
    if (read_fd, write_fd) == fds:
        return read_fd, write_fd
    # Through numbers other than ``fds`` so that no dup2 lands on an end still needed.
    spare_read, spare_write = os.dup(read_fd), os.dup(write_fd)
    os.close(read_fd)
    os.close(write_fd)
    os.dup2(spare_read, fds[0], inheritable=False)
    os.dup2(spare_write, fds[1], inheritable=False)
    os.close(spare_read)
    os.close(spare_write)
    return fds


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def _close_quietly(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def test_late_return_after_close_does_not_signal_a_reused_pipe(
        blocking_get: _BlockingGet) -> None:
    name = "cairn-test-ray-exit-late"
    watcher = ray_worker._RefWatcher(object(), name, "node")
    assert blocking_get.entered.wait(10.0)
    old = (watcher._read_fd, watcher._write_fd)
    assert old[0] is not None and old[1] is not None
    thread = _thread(name)
    # kill_ranks past its wait: closed while the thread is still in ray.get.
    watcher.close()
    new_read, new_write = _pipe_at((old[0], old[1]))  # a replacement rank's watcher
    try:
        blocking_get.release.set()
        thread.join(10.0)
        assert not thread.is_alive()
        assert watcher.outcome == "exited with code 0"
        assert not _readable(new_read), "the old watcher signalled the new pipe"
        watcher.close()  # shutdown() closing it again
        os.fstat(new_read)
        os.fstat(new_write)
        assert not _readable(new_read)
    finally:
        _close_quietly(new_read, new_write)


def test_close_twice_leaves_fds_opened_in_between(blocking_get: _BlockingGet) -> None:
    watcher = ray_worker._RefWatcher(object(), "cairn-test-ray-exit-twice", "node")
    old = (watcher._read_fd, watcher._write_fd)
    assert old[0] is not None and old[1] is not None
    watcher.close()  # kill_ranks
    # Another thread's file or socket (a manifest being committed, a Ray socket).
    foreign = _pipe_at((old[0], old[1]))
    try:
        watcher.close()  # shutdown
        for fd in foreign:
            os.fstat(fd)
        os.write(foreign[1], b"y")
        assert os.read(foreign[0], 1) == b"y"
    finally:
        _close_quietly(*foreign)


def test_exit_signals_then_closes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray_worker.ray, "get", lambda ref, *a, **k: 3)
    watcher = ray_worker._RefWatcher(object(), "cairn-test-ray-exit-ok", "node")
    assert watcher.wait(10.0)
    fd = watcher.fileno()
    assert select.select([fd], [], [], 10.0)[0] == [fd]
    assert watcher.code == 3
    assert watcher.outcome == "exited with code 3"
    watcher.close()
    watcher.close()
    with pytest.raises(ValueError):
        watcher.fileno()  # nothing selects on a number that may be reused
