"""Small files between local directories, a directory at a time: the fast path of the
directory transfers in :mod:`.transfer`.

A transfer task per file costs tens of microseconds of Python around a kilobyte of data
(retry wrappers, a pooled buffer, a streaming hasher, a component-by-component walk of the
path). Here the files of one directory share one walk: the directory is opened once
(every component below the checkpoint directory with ``O_NOFOLLOW``, as the bounded
reader of :mod:`.reader` does) and each file is checked, read whole, hashed and written
with a fixed sequence of calls on that directory's descriptor (:mod:`._smallio`).

Creating a file is a few system calls, each too short for Python threads to share the
interpreter well (threads were 2-3 times slower than one on tmpfs). So many files
(:data:`MIN_SHARE_FILES` a share at least) are split into shares of equal count, one a
core (:func:`processes`): the calling thread copies one and a copy process each of the
others, on other cores. When a copy process cannot start, fails, or answers other than
for each file of its share exactly once, its share is copied by the calling thread after
all (a download's temporaries in it removed first), and so is every share of later calls
in this process: a warning says why, once.

This path only ever finishes the expected case. A file it cannot finish as expected (a
link, a FIFO or device, a size or checksum that differs, a file larger than
:data:`SMALL_FILE_BYTES`, any OS error) is handed back untouched, and the per-file path
checks it again, retries it and reports it in its own words. So nothing here raises for
a file, or decides that one is damaged, and what it accepts the per-file path accepts too.

Not thread-safe per call (one caller thread per call); calls may run concurrently.
"""

from __future__ import annotations

import io
import json
import logging
import marshal
import os
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from cairn._src.storage import _smallio
from cairn._src.storage._smallio import SMALL_FILE_BYTES, Group
from cairn._src.storage.checksum import CHECKSUM_ALGORITHM, FileEntry

__all__ = ["MIN_SHARE_FILES", "SMALL_FILE_BYTES", "Job", "available", "processes", "run"]

_log = logging.getLogger(__name__)

# Fewer files than this a share do not pay for starting a copy process (about 50 ms,
# the time to copy some 1,500 small files).
MIN_SHARE_FILES = 4096
# Beyond a few processes, creating files in one file system contends in its kernel.
MAX_PROCESSES = 8

# The copy process runs _smallio as a script, with this process's module path (the
# working directory left out), so that it finds the same xxhash without importing cairn.
# It starts isolated (-I): with a plain -c the working directory would come first on its
# path until the bootstrap sets it, and a json.py or runpy.py there (anyone may write a
# shared working directory) would run inside `cairn verify` or to_directory(). -I also
# leaves out PYTHON* variables and the user's site directory; the path given is complete,
# so -S leaves out the site module too (no .pth file runs, and the start takes about a
# third less: 60 ms instead of 95 on a loaded machine of 2 cores).
_ISOLATED = ("-I", "-S")
_BOOTSTRAP = ("import sys, json, runpy; sys.path[:] = json.loads(sys.argv[2]); "
              "runpy.run_path(sys.argv[1], run_name='__main__')")
_STDERR_SHOWN = 2000
# An answer is at most a relative path, a size and a checksum a file asked for.
_ANSWER_BYTES_PER_FILE = 4096

# Set once a copy process has failed in this process: the next calls copy in-process.
_copy_processes_failed = False


def _no_progress(_: int) -> None:
    pass


@dataclass(frozen=True)
class Job:
    """What :func:`run` does with each small file: ``operation`` (``upload``,
    ``download``, ``hash`` or ``sizes``) on the files under the local directory
    ``root``, writing under ``target`` (``upload``, ``download``). ``progress`` is told
    the bytes copied, a directory at a time; ``max_workers`` bounds the processes."""

    operation: Literal["upload", "download", "hash", "sizes"]
    root: str
    target: str = ""
    follow_links: bool = False
    verify: bool = True
    max_workers: int | None = None
    background: bool = False
    progress: Callable[[int], None] = _no_progress


def available() -> bool:
    """Whether this platform has what the fast path needs (directory descriptors)."""
    return _smallio.available() and CHECKSUM_ALGORITHM == "xxh3_128"


def _cores() -> int:
    """The cores this process may use: its CPU affinity, within its cgroup's CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max", encoding="ascii") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return cores


def processes(max_workers: int | None) -> int:
    """How many processes share many small files: the cores this process may use (its
    CPU affinity and cgroup quota), at most ``max_workers`` and :data:`MAX_PROCESSES`."""
    cores = min(_cores(), MAX_PROCESSES)
    return max(1, min(cores, max_workers or cores))


def _interpreter() -> str | None:
    """This process's Python interpreter, when copy processes can run it."""
    executable = sys.executable
    if (_copy_processes_failed or not executable or getattr(sys, "frozen", False)
            or not os.path.basename(executable).lower().startswith("python")):
        return None
    return executable


def _by_directory(rels: Iterable[str]) -> dict[str, list[tuple[str, str]]]:
    """``directory -> [(name, rel)]`` for checked relative paths, in first-seen order."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for rel in rels:
        directory, _, name = rel.rpartition("/")
        groups.setdefault(directory, []).append((name, rel))
    return groups


def _shares(groups: Sequence[Group], max_workers: int | None) -> list[list[Group]]:
    """``groups`` split into at most :func:`processes` shares of about equal file count
    (within one file), none of them much under :data:`MIN_SHARE_FILES`; a large directory
    is split between shares. The cores are looked up only for that many files."""
    total = sum(len(items) for _, items in groups)
    if total < 2 * MIN_SHARE_FILES:
        return [list(groups)]
    count = min(processes(max_workers), total // MIN_SHARE_FILES)
    if count == 1:
        return [list(groups)]
    size = -(-total // count)
    shares: list[list[Group]] = [[]]
    room = size
    for directory, items in groups:
        start = 0
        while start < len(items):
            if not room:
                shares.append([])
                room = size
            part = items[start:start + room]
            shares[-1].append((directory, part))
            room -= len(part)
            start += len(part)
    return shares


def _scratch() -> io.BufferedRandom:
    """An anonymous file for a copy process's request or answer (no pipe: neither side
    waits for the other to read)."""
    if hasattr(os, "memfd_create"):
        try:
            return open(os.memfd_create("cairn-small-files", os.MFD_CLOEXEC), "w+b")
        except OSError:
            pass
    return tempfile.TemporaryFile()


class _CopyProcess:
    """One share copied by another process (see :mod:`._smallio`): :meth:`start`, then
    :meth:`result`, or :meth:`stop` (which may be called at any point)."""

    def __init__(self, request: tuple[Any, ...], rels: list[str]) -> None:
        self.rels = rels
        self._request = request
        self._process: subprocess.Popen[bytes] | None = None
        self._answer: io.BufferedRandom | None = None
        self._errors: io.BufferedRandom | None = None

    def start(self, interpreter: str) -> None:
        self._answer = _scratch()
        self._errors = _scratch()
        with _scratch() as asked:
            asked.write(marshal.dumps(self._request))
            asked.seek(0)
            path = json.dumps([entry for entry in sys.path if entry])
            self._process = subprocess.Popen(
                [interpreter, *_ISOLATED, "-c", _BOOTSTRAP, _smallio.__file__, path],
                stdin=asked, stdout=self._answer, stderr=self._errors, close_fds=True)

    def result(self) -> tuple[dict[str, tuple[int, str]], list[str], int] | None:
        """(entries, files left, bytes done), or None when the share was not copied (the
        reason logged)."""
        assert self._process is not None and self._answer is not None
        try:
            code = self._process.wait()
            if code != 0:
                _failed("exited with status %s; its error output ends: %r", code,
                        self._stderr_tail())
                return None
            size = os.fstat(self._answer.fileno()).st_size
            if size > _ANSWER_BYTES_PER_FILE * (len(self.rels) + 1):
                _failed("answered %d bytes for %d files", size, len(self.rels))
                return None
            self._answer.seek(0)
            answer = marshal.loads(self._answer.read())
            if not _answers(answer, self.rels):
                _failed("answered about other files than the %d it was asked for",
                        len(self.rels))
                return None
            return answer  # type: ignore[no-any-return]
        except (EOFError, ValueError, TypeError, OSError) as exc:
            _failed("gave an unreadable answer (%s)", exc)
            return None
        finally:
            self._close()

    def _stderr_tail(self) -> str:
        assert self._errors is not None
        size = os.fstat(self._errors.fileno()).st_size
        self._errors.seek(max(0, size - _STDERR_SHOWN))
        return self._errors.read().decode(errors="replace").strip()

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self._close()

    def _close(self) -> None:
        for scratch in (self._answer, self._errors):
            if scratch is not None:
                scratch.close()


def _failed(reason: str, *args: object) -> None:
    """Log why a copy process failed (a warning the first time in this process), and copy
    in-process from now on."""
    global _copy_processes_failed
    level = logging.DEBUG if _copy_processes_failed else logging.WARNING
    _copy_processes_failed = True
    _log.log(level, "A small-file copy process " + reason + "; its files are copied by "
             "this process, as are those of later transfers in it.", *args)


def _answers(answer: Any, asked: list[str]) -> bool:
    """Whether ``answer`` is (entries, left, bytes) that account for each file of
    ``asked`` exactly once."""
    if not (type(answer) is tuple and len(answer) == 3):
        return False
    entries, left, done = answer
    if not (type(entries) is dict and type(left) is list and type(done) is int
            and done >= 0 and len(entries) + len(left) == len(asked)):
        return False
    return set(entries).union(left) == set(asked) and all(
        type(value) is tuple and len(value) == 2 and type(value[0]) is int
        and value[0] >= 0 and type(value[1]) is str for value in entries.values())


def _share_rels(share: Sequence[Group]) -> list[str]:
    return [_smallio.relpath(directory, item if isinstance(item, str) else item[0])
            for directory, items in share for item in items]


def _request(job: Job, starter: int | None, share: list[Group]) -> tuple[Any, ...]:
    """What :func:`._smallio.run_share` is asked to do with ``share`` for ``job``."""
    if job.operation == "hash":
        return job.operation, starter, job.root, share, job.follow_links
    return job.operation, starter, job.root, job.target, share


def _in_shares(
    job: Job, shares: list[list[Group]], *, all_elsewhere: bool = False,
) -> tuple[dict[str, tuple[int, str]], set[str]]:
    """Copy the first share on the calling thread (unless ``all_elsewhere``) and each
    other in a copy process; (entries, files left) of them all. A share whose copy
    process fails is cleaned up (a download's files in it removed) and copied on the
    calling thread after all."""
    interpreter = _interpreter() if len(shares) > 1 or all_elsewhere else None
    elsewhere: list[list[Group]]
    if interpreter is None:
        mine, elsewhere = list(shares), []
    else:
        mine, elsewhere = ([], shares) if all_elsewhere else (shares[:1], shares[1:])
    started: list[tuple[list[Group], _CopyProcess]] = []
    entries: dict[str, tuple[int, str]] = {}
    left: set[str] = set()

    def local(share: list[Group]) -> None:
        found, not_done = _smallio.run_share(_request(job, None, share), job.progress)
        entries.update(found)
        left.update(not_done)

    def failed(share: list[Group]) -> None:
        if job.operation == "download":
            _remove_share(job.target, share)

    try:
        for share in elsewhere:
            process = _CopyProcess(_request(job, os.getpid(), share), _share_rels(share))
            started.append((share, process))
            try:
                process.start(interpreter)  # type: ignore[arg-type]
            except Exception as exc:  # Not started: nothing to clean up.
                _failed("could not start (%s)", exc)
                started.pop()
                mine.append(share)
        for share in mine:
            local(share)
        while started:
            share, process = started[0]
            result = process.result()
            started.pop(0)
            if result is None:
                failed(share)
                local(share)
                continue
            entries.update(result[0])
            left.update(result[1])
            job.progress(result[2])
    finally:
        for share, process in started:
            process.stop()
            failed(share)
    return entries, left


def _remove_share(staging: str, share: Sequence[Group]) -> None:
    """Remove what a copy process which did not finish wrote of its ``share`` (a file
    may be half-written), so that the share can be copied again."""
    for directory, items in share:
        with _smallio.opened_directory(staging, directory, follow_links=False) as fd:
            if fd is None:
                continue
            for item in items:
                _smallio.unlink(item[0], fd)


def run(job: Job, files: Mapping[str, FileEntry | int | None]) -> tuple[
        dict[str, FileEntry], set[str]]:
    """Do ``job`` to the small ``files`` (checked relpath -> expected entry, size, or None
    when not known): the one entry to this path.

    * ``upload``: copy the files of ``job.root`` (listed by
      :func:`~cairn._src.storage.paths.list_local_files`, whose links are then followed)
      to the same paths under the local directory ``job.target``, whose directories
      exist, hashing each. ``background``: other threads of this process keep running
      Python meanwhile, so copy processes take every share of many files (none is copied
      by the calling thread), unless :func:`processes` is 1.
    * ``download``: copy them from the checkpoint directory ``job.root`` into
      ``job.target``, the caller's staging directory: its directories exist, no one else
      writes in it, and it is moved into place only once complete
      (:func:`.transfer.download_directory`); with ``job.verify`` the checksum of an
      entry is compared. Each file is written under its own name, which nothing in the
      staging directory may have yet.
    * ``hash``: read and hash them in place under ``job.root`` (a link followed only
      with ``job.follow_links``); a file whose size or checksum differs from its entry
      is left, not judged.
    * ``sizes``: one ``stat`` each below directories opened without following a link;
      nothing is opened or read (a FIFO or device is never opened). A file that is not
      a regular file of its size is left.

    Returns (the entries of the files read and hashed as expected: ``upload`` and
    ``hash``, else empty; the files left for the per-file path).
    """
    groups: list[Group] = []
    for directory, names in _by_directory(files).items():
        groups.append((directory, [_item(job, name, files[rel]) for name, rel in names]))
    if job.operation == "sizes":
        return {}, _check_sizes(job.root, groups)
    many = sum(len(items) for _, items in groups) >= MIN_SHARE_FILES
    entries, left = _in_shares(
        job, _shares(groups, job.max_workers),
        all_elsewhere=(job.operation == "upload" and job.background and many
                       and processes(job.max_workers) > 1))
    return ({} if job.operation == "download" else _entries(entries)), left


def _item(job: Job, name: str, want: FileEntry | int | None) -> Any:
    """What a share holds of one file, for ``job``'s operation (see :mod:`._smallio`)."""
    if job.operation == "upload":
        return name
    if job.operation == "sizes":
        return name, want.size if isinstance(want, FileEntry) else want
    if isinstance(want, FileEntry):
        checksum = want.checksum if job.verify or job.operation == "hash" else None
        return name, want.size, checksum
    return name, want, None


def _entries(found: Mapping[str, tuple[int, str]]) -> dict[str, FileEntry]:
    return {rel: FileEntry(size=size, checksum=checksum)
            for rel, (size, checksum) in found.items()}


def _check_sizes(root: str, groups: Sequence[Group]) -> set[str]:
    left: set[str] = set()
    for directory, items in groups:
        with _smallio.opened_directory(root, directory, follow_links=False) as source:
            if source is None:
                left.update(_smallio.relpath(directory, name) for name, _ in items)
                continue
            for name, size in items:
                try:
                    info = os.stat(name, dir_fd=source, follow_symlinks=False)
                except OSError:
                    left.add(_smallio.relpath(directory, name))
                    continue
                if not stat.S_ISREG(info.st_mode) or info.st_size != size:
                    left.add(_smallio.relpath(directory, name))
    return left
