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
from typing import Any

from cairn._src.storage import _smallio
from cairn._src.storage._smallio import SMALL_FILE_BYTES, Group
from cairn._src.storage.checksum import CHECKSUM_ALGORITHM, FileEntry

__all__ = ["MIN_SHARE_FILES", "SMALL_FILE_BYTES", "available", "check_sizes", "download",
           "hash_files", "processes", "upload"]

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
# leaves out PYTHON* variables and the user's site directory; the path given is complete.
_ISOLATED = "-I"
_BOOTSTRAP = ("import sys, json, runpy; sys.path[:] = json.loads(sys.argv[2]); "
              "runpy.run_path(sys.argv[1], run_name='__main__')")
_STDERR_SHOWN = 2000
# An answer is at most a relative path, a size and a checksum a file asked for.
_ANSWER_BYTES_PER_FILE = 4096

# Set once a copy process has failed in this process: the next calls copy in-process.
_copy_processes_failed = False


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
                [interpreter, _ISOLATED, "-c", _BOOTSTRAP, _smallio.__file__, path],
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


Answer = tuple[dict[str, tuple[int, str]], list[str]]


def _in_shares(
    shares: list[list[Group]],
    local: Callable[[list[Group]], Answer],
    request: Callable[[list[Group]], tuple[Any, ...]],
    progress: Callable[[int], None],
    *,
    all_elsewhere: bool = False,
    failed: Callable[[list[Group]], None] | None = None,
) -> tuple[dict[str, tuple[int, str]], set[str]]:
    """Run the first share with ``local`` (unless ``all_elsewhere``) and each other in a
    copy process; (entries, files left) of them all. A share whose copy process fails is
    cleaned up with ``failed`` and copied with ``local`` after all."""
    interpreter = _interpreter() if len(shares) > 1 or all_elsewhere else None
    elsewhere: list[list[Group]]
    if interpreter is None:
        mine, elsewhere = list(shares), []
    else:
        mine, elsewhere = ([], shares) if all_elsewhere else (shares[:1], shares[1:])
    started: list[tuple[list[Group], _CopyProcess]] = []
    entries: dict[str, tuple[int, str]] = {}
    left: set[str] = set()

    def take(answer: Answer) -> None:
        entries.update(answer[0])
        left.update(answer[1])

    try:
        for share in elsewhere:
            operation, *args = request(share)
            process = _CopyProcess((operation, os.getpid(), *args), _share_rels(share))
            started.append((share, process))
            try:
                process.start(interpreter)  # type: ignore[arg-type]
            except Exception as exc:  # Not started: nothing to clean up.
                _failed("could not start (%s)", exc)
                started.pop()
                mine.append(share)
        for share in mine:
            take(local(share))
        while started:
            share, process = started[0]
            result = process.result()
            started.pop(0)
            if result is None:
                if failed is not None:
                    failed(share)
                take(local(share))
                continue
            take(result[:2])
            progress(result[2])
    finally:
        for share, process in started:
            process.stop()
            if failed is not None:
                failed(share)
    return entries, left


def download(
    src_root: str,
    staging: str,
    files: Mapping[str, FileEntry | int],
    *,
    verify: bool,
    progress: Callable[[int], None],
    max_workers: int | None = None,
) -> set[str]:
    """Copy the small ``files`` (checked relpath -> expected entry or size) from the
    checkpoint directory ``src_root`` into ``staging``, the caller's staging directory:
    its directories exist, no one else writes in it, and it is moved into place only
    once complete (:func:`.transfer.download_directory`).

    With ``verify`` the checksum of an entry is compared. Each file is written under its
    own name, which nothing in ``staging`` may have yet. Returns the files not copied,
    for the per-file path.
    """
    groups: list[Group] = []
    for directory, names in _by_directory(files).items():
        items = []
        for name, rel in names:
            want = files[rel]
            if isinstance(want, FileEntry):
                items.append((name, want.size, want.checksum if verify else None))
            else:
                items.append((name, want, None))
        groups.append((directory, items))

    def local(share: list[Group]) -> Answer:
        return _smallio.download_share(src_root, staging, share, progress=progress)

    _, left = _in_shares(
        _shares(groups, max_workers), local,
        lambda share: ("download", src_root, staging, share), progress,
        failed=lambda share: _remove_share(staging, share))
    return left


def _remove_share(staging: str, share: Sequence[Group]) -> None:
    """Remove what a copy process which did not finish wrote of its ``share`` (a file
    may be half-written), so that the share can be copied again."""
    for directory, items in share:
        with _smallio.opened_directory(staging, directory, follow_links=False) as fd:
            if fd is None:
                continue
            for item in items:
                _smallio.unlink(item[0], fd)


def hash_files(
    root: str,
    files: Mapping[str, FileEntry | None],
    *,
    follow_links: bool = False,
    max_workers: int | None = None,
) -> tuple[dict[str, FileEntry], set[str]]:
    """Read and hash the small ``files`` (checked relpath -> expected entry or None)
    under the local directory ``root``, in place.

    Returns (the entries of the files read as expected, the files left for the per-file
    path): a file whose checksum differs from its expected entry is left, not judged.
    """
    groups: list[Group] = []
    for directory, names in _by_directory(files).items():
        items = []
        for name, rel in names:
            want = files[rel]
            items.append((name, None, None) if want is None
                         else (name, want.size, want.checksum))
        groups.append((directory, items))
    entries, left = _in_shares(
        _shares(groups, max_workers),
        lambda share: _smallio.hash_share(root, share, follow_links=follow_links),
        lambda share: ("hash", root, share, follow_links),
        lambda _: None)
    return _entries(entries), left


def upload(
    local_dir: str,
    dest_root: str,
    names: Iterable[str],
    *,
    progress: Callable[[int], None],
    max_workers: int | None = None,
    background: bool = False,
) -> tuple[dict[str, FileEntry], set[str]]:
    """Copy the small files ``names`` (checked relpaths, already listed by
    :func:`~cairn._src.storage.paths.list_local_files`, whose links are then followed)
    of ``local_dir`` to the local directory ``dest_root``, whose directories exist.

    ``background``: other threads of this process keep running Python meanwhile, so
    copy processes take every share of many files (none is copied by the calling
    thread), unless :func:`processes` is 1.

    Returns (the entries of the files copied, the files left for the per-file path).
    """
    groups: list[Group] = [(directory, [name for name, _ in group])
                           for directory, group in _by_directory(names).items()]
    many = sum(len(group) for _, group in groups) >= MIN_SHARE_FILES
    entries, left = _in_shares(
        _shares(groups, max_workers),
        lambda share: _smallio.upload_share(local_dir, dest_root, share, progress=progress),
        lambda share: ("upload", local_dir, dest_root, share),
        progress, all_elsewhere=background and many and processes(max_workers) > 1)
    return _entries(entries), left


def _entries(found: Mapping[str, tuple[int, str]]) -> dict[str, FileEntry]:
    return {rel: FileEntry(size=size, checksum=checksum)
            for rel, (size, checksum) in found.items()}


def check_sizes(root: str, sizes: Mapping[str, int]) -> set[str]:
    """The files of ``sizes`` (checked relpath -> size) under the checkpoint directory
    ``root`` that are not a regular file of that size reached without a link: left for
    the per-file path. Nothing is opened or read (a FIFO or device is never opened).
    """
    left: set[str] = set()
    for directory, names in _by_directory(sizes).items():
        with _smallio.opened_directory(root, directory, follow_links=False) as source:
            if source is None:
                left.update(rel for _, rel in names)
                continue
            for name, rel in names:
                try:
                    info = os.stat(name, dir_fd=source, follow_symlinks=False)
                except OSError:
                    left.add(rel)
                    continue
                if not stat.S_ISREG(info.st_mode) or info.st_size != sizes[rel]:
                    left.add(rel)
    return left
