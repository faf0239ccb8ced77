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
(:data:`MIN_SHARE_FILES` a share at least) are split into ``processes`` shares of equal
count: the calling thread copies one and a copy process each of the others, on other
cores. A copy process that cannot start, fails or answers what was not asked hands its
whole share back (a download's temporaries in it removed), as if it had copied nothing.

This path only ever finishes the expected case. A file it cannot finish as expected (a
link, a FIFO or device, a size or checksum that differs, a file larger than
:data:`SMALL_FILE_BYTES`, any OS error) is handed back untouched, and the per-file path
checks it again, retries it and reports it in its own words. So nothing here raises for
a file, or decides that one is damaged, and what it accepts the per-file path accepts too.

Not thread-safe per call (one caller thread per call); calls may run concurrently.
"""

from __future__ import annotations

import io
import logging
import marshal
import os
import secrets
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from cairn._src.storage import _smallio
from cairn._src.storage._smallio import SMALL_FILE_BYTES, Group
from cairn._src.storage.checksum import CHECKSUM_ALGORITHM, FileEntry
from cairn._src.storage.fileio import TEMPORARY_MARK

__all__ = ["MIN_SHARE_FILES", "SMALL_FILE_BYTES", "available", "check_sizes", "download",
           "hash_files", "processes", "upload"]

_log = logging.getLogger(__name__)

# Fewer files than this a share do not pay for starting a copy process (about 50 ms,
# the time to copy some 1,500 small files).
MIN_SHARE_FILES = 4096

# The copy process runs _smallio as a script, with nothing from the working directory
# ahead of the standard library (python -P is 3.11+).
_BOOTSTRAP = ("import sys; del sys.path[0]; import runpy; "
              "runpy.run_path(sys.argv[1], run_name='__main__')")
_STDERR_SHOWN = 2000


def available() -> bool:
    """Whether this platform has what the fast path needs (directory descriptors)."""
    return _smallio.available() and CHECKSUM_ALGORITHM == "xxh3_128"


def processes(max_workers: int | None) -> int:
    """How many processes share many small files: the cores this process may run on, at
    most ``max_workers``."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(cores, max_workers or cores))


def _by_directory(rels: Iterable[str]) -> dict[str, list[tuple[str, str]]]:
    """``directory -> [(name, rel)]`` for checked relative paths, in first-seen order."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for rel in rels:
        directory, _, name = rel.rpartition("/")
        groups.setdefault(directory, []).append((name, rel))
    return groups


def _shares(groups: Sequence[Group], count: int) -> list[list[Group]]:
    """``groups`` split into at most ``count`` shares of about equal file count, each at
    least :data:`MIN_SHARE_FILES` (a large directory is split between shares)."""
    total = sum(len(items) for _, items in groups)
    count = max(1, min(count, total // MIN_SHARE_FILES))
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
        return open(os.memfd_create("cairn-small-files", os.MFD_CLOEXEC), "w+b")
    return tempfile.TemporaryFile()


class _CopyProcess:
    """One share copied by another process (see :mod:`._smallio`)."""

    def __init__(self, request: tuple[Any, ...], rels: list[str]) -> None:
        self.rels = rels
        self._answer = _scratch()
        self._errors = _scratch()
        with _scratch() as asked:
            asked.write(marshal.dumps(request))
            asked.seek(0)
            self._process = subprocess.Popen(
                [sys.executable, "-c", _BOOTSTRAP, _smallio.__file__],
                stdin=asked, stdout=self._answer, stderr=self._errors, close_fds=True)

    def result(self) -> tuple[dict[str, tuple[int, str]], list[str], int] | None:
        """(entries, files left, bytes done), or None when the share was not copied."""
        try:
            code = self._process.wait()
            if code == 0:
                self._answer.seek(0)
                answer = marshal.loads(self._answer.read())
                if _well_formed(answer, set(self.rels)):
                    return answer  # type: ignore[no-any-return]
                _log.warning("A small-file copy process answered what it was not asked; "
                             "its %d files go file by file.", len(self.rels))
                return None
            self._errors.seek(0)
            errors = self._errors.read()[-_STDERR_SHOWN:].decode(errors="replace")
            _log.warning("A small-file copy process exited with status %s; its %d files "
                         "go file by file. Its error output: %s", code, len(self.rels),
                         errors.strip() or "(none)")
            return None
        except (EOFError, ValueError, TypeError, OSError) as exc:
            _log.warning("A small-file copy process gave an unreadable answer (%s); its %d "
                         "files go file by file.", exc, len(self.rels))
            return None
        finally:
            self._answer.close()
            self._errors.close()

    def stop(self) -> None:
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        self._answer.close()
        self._errors.close()


def _well_formed(answer: Any, asked: set[str]) -> bool:
    if not (isinstance(answer, tuple) and len(answer) == 3):
        return False
    entries, left, done = answer
    return (isinstance(entries, dict) and isinstance(left, list) and isinstance(done, int)
            and set(entries) <= asked and set(left) <= asked
            and all(isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], int)
                    and isinstance(v[1], str) for v in entries.values()))


def _share_rels(share: Sequence[Group]) -> list[str]:
    return [_smallio.relpath(directory, item if isinstance(item, str) else item[0])
            for directory, items in share for item in items]


def _in_shares(
    shares: list[list[Group]],
    local: Callable[[list[Group]], tuple[dict[str, tuple[int, str]], list[str]]],
    request: Callable[[list[Group]], tuple[Any, ...]],
    progress: Callable[[int], None],
    *,
    all_elsewhere: bool = False,
    failed: Callable[[list[Group]], None] | None = None,
) -> tuple[dict[str, tuple[int, str]], set[str]]:
    """Run the first share with ``local`` (unless ``all_elsewhere``) and each other in a
    copy process; (entries, files left) of them all."""
    mine = [] if all_elsewhere else shares[:1]
    elsewhere = shares[len(mine):]
    started: list[tuple[list[Group], _CopyProcess | None]] = []
    entries: dict[str, tuple[int, str]] = {}
    left: set[str] = set()
    try:
        for share in elsewhere:
            operation, *args = request(share)
            try:
                started.append((share, _CopyProcess((operation, os.getpid(), *args),
                                                    _share_rels(share))))
            except OSError as exc:
                _log.warning("Cannot start a small-file copy process (%s); its files go "
                             "file by file.", exc)
                started.append((share, None))
        for share in mine:
            got, not_done = local(share)
            entries.update(got)
            left.update(not_done)
        while started:
            share, process = started[0]
            result = None if process is None else process.result()
            started.pop(0)
            if result is None:
                if process is not None and failed is not None:
                    failed(share)
                left.update(_share_rels(share))
                continue
            got, not_done, done = result
            entries.update(got)
            left.update(not_done)
            progress(done)
    finally:
        for share, process in started:
            if process is not None:
                process.stop()
                if failed is not None:
                    failed(share)
    return entries, left


def download(
    src_root: str,
    local_dir: str,
    files: Mapping[str, FileEntry | int],
    *,
    verify: bool,
    progress: Callable[[int], None],
    processes: int = 1,
) -> set[str]:
    """Copy the small ``files`` (checked relpath -> expected entry or size) from the
    checkpoint directory ``src_root`` into ``local_dir``, whose directories exist.

    With ``verify`` the checksum of an entry is compared. Each file is written under a
    temporary name in its directory and renamed once complete and verified. Returns the
    files not copied, for the per-file path.
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
    shares = _shares(groups, processes)
    prefix_of = {id(share): f"{TEMPORARY_MARK}{secrets.token_hex(3)}" for share in shares}

    def local(share: list[Group]) -> tuple[dict[str, tuple[int, str]], list[str]]:
        return {}, _smallio.download_share(src_root, local_dir, share,
                                           prefix=prefix_of[id(share)], progress=progress)

    def failed(share: list[Group]) -> None:
        _remove_temporaries(local_dir, share, prefix_of[id(share)])

    _, left = _in_shares(
        shares, local,
        lambda share: ("download", src_root, local_dir, share, prefix_of[id(share)]),
        progress, failed=failed)
    return left


def _remove_temporaries(local_dir: str, share: Sequence[Group], prefix: str) -> None:
    """Remove what a copy process that did not finish left under ``prefix`` in the
    directories of its ``share``."""
    for directory in dict.fromkeys(directory for directory, _ in share):
        with _smallio.opened_directory(local_dir, directory, follow_links=True) as fd:
            if fd is None:
                continue
            try:
                names = os.listdir(fd)
            except OSError:
                continue
            for name in names:
                if name.startswith(prefix):
                    _smallio.unlink(name, fd)


def hash_files(
    root: str,
    files: Mapping[str, FileEntry | None],
    *,
    follow_links: bool = False,
    processes: int = 1,
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
        _shares(groups, processes),
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
    processes: int = 1,
    background: bool = False,
) -> tuple[dict[str, FileEntry], set[str]]:
    """Copy the small files ``names`` (checked relpaths, already listed by
    :func:`~cairn._src.storage.paths.list_local_files`, whose links are then followed)
    of ``local_dir`` to the local directory ``dest_root``, whose directories exist.

    ``background``: other threads of this process keep running Python meanwhile, so
    copy processes take every share of many files (none is copied by the calling
    thread), unless ``processes`` is 1.

    Returns (the entries of the files copied, the files left for the per-file path).
    """
    groups: list[Group] = [(directory, [name for name, _ in group])
                           for directory, group in _by_directory(names).items()]
    many = sum(len(group) for _, group in groups) >= MIN_SHARE_FILES
    entries, left = _in_shares(
        _shares(groups, processes),
        lambda share: _smallio.upload_share(local_dir, dest_root, share, progress=progress),
        lambda share: ("upload", local_dir, dest_root, share),
        progress, all_elsewhere=background and many and processes > 1)
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
