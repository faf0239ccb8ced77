"""The system calls of the small-file fast path (:mod:`.batch`), on plain data, and the
copy process that runs a share of them on another core.

This module imports only the standard library and ``xxhash``: a copy process runs it as
a script, without importing ``cairn`` (which costs far more than copying a share).

A share is a list of ``(directory, items)`` groups; a file is ``directory/name`` (or
``name`` at the top). Every function here finishes only the expected case and returns
the relative paths it did not finish, untouched, for the per-file path: it raises for no
file and judges none damaged.

The copy process reads one request from its standard input (``marshal``: it comes from
the process that started it, with the same interpreter, never from storage) and writes
one result to its standard output. Once its parent is gone it stops within
``_CHECK_EVERY`` files, answering nothing (exit status :data:`STOPPED`), so an orphan
never writes on into a directory that was cleaned up.
"""

from __future__ import annotations

import errno
import marshal
import os
import stat
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import xxhash

# Files up to this size are read whole into memory by this path; larger ones stream.
SMALL_FILE_BYTES = 256 << 10

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
# What opening a link with O_NOFOLLOW fails with (ELOOP on Linux, EMLINK on the BSDs).
_LINK_ERRORS = frozenset({errno.ELOOP, errno.EMLINK})
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_READ_FLAGS = os.O_RDONLY | _NONBLOCK | _CLOEXEC
_DIR_FLAGS = os.O_RDONLY | _DIRECTORY | _NONBLOCK | _CLOEXEC
# O_EXCL | O_NOFOLLOW: never write through something that already has the name.
NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
# An upload's destination is not committed yet: a retry truncates what a failed try wrote,
# and a link planted under the name is not written through.
TRUNCATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW | _CLOEXEC
# How many files a copy process copies between two checks that its starter still runs.
_CHECK_EVERY = 64

hexdigest: Callable[[bytes], str] = xxhash.xxh3_128_hexdigest

Group = tuple[str, list[Any]]  # (directory, its names or per-file items)
Entries = dict[str, tuple[int, str]]  # relpath -> (size, checksum)


def available() -> bool:
    """Whether this platform has what the fast path needs (directory descriptors)."""
    return bool(
        _NOFOLLOW and _DIRECTORY and os.open in os.supports_dir_fd
        and os.stat in os.supports_dir_fd and os.rename in os.supports_dir_fd
    )


def relpath(directory: str, name: str) -> str:
    return f"{directory}/{name}" if directory else name


@contextmanager
def opened_directory(root: str, directory: str, *, follow_links: bool) -> Iterator[int | None]:
    """A descriptor of ``root/directory`` (None when it cannot be opened as expected).

    ``root`` itself may be a link (a user's path); below it, a link is not followed unless
    ``follow_links``.
    """
    fd: int | None = None
    try:
        fd = os.open(root, _DIR_FLAGS)
        for part in directory.split("/") if directory else ():
            flags = _DIR_FLAGS if follow_links else _DIR_FLAGS | _NOFOLLOW
            next_fd = os.open(part, flags, dir_fd=fd)
            os.close(fd)
            fd = next_fd
    except OSError:
        if fd is not None:
            os.close(fd)
        fd = None
    try:
        yield fd
    finally:
        if fd is not None:
            os.close(fd)


@contextmanager
def _directories(source_root: str, target_root: str, directory: str, *,
                 follow_links: bool) -> Iterator[tuple[int, int] | None]:
    """Descriptors of ``directory`` under ``source_root`` (see :func:`opened_directory`)
    and under ``target_root`` (links followed: a user's path), or None if either cannot be
    opened."""
    target_dir = os.path.join(target_root, *directory.split("/")) if directory else target_root
    with (opened_directory(source_root, directory, follow_links=follow_links) as source,
          opened_directory(target_dir, "", follow_links=True) as target):
        yield None if source is None or target is None else (source, target)


def read(name: str, dir_fd: int, expected: int | None, follow_links: bool) -> bytes | None:
    """The whole of the regular file ``name`` (None unless it is one as expected).

    As the bounded reader checks: the type before opening (a FIFO or device is never
    opened), the same file on the open descriptor, at most one byte more than its size.
    """
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=follow_links)
        if not _wanted(info, expected):
            return None
        fd = os.open(name, _READ_FLAGS if follow_links else _READ_FLAGS | _NOFOLLOW,
                     dir_fd=dir_fd)
        try:
            opened = os.fstat(fd)
            if not stat.S_ISREG(opened.st_mode) or (opened.st_dev, opened.st_ino) != (
                info.st_dev, info.st_ino
            ):
                return None
            return _read_whole(fd, info.st_size)
        finally:
            os.close(fd)
    except OSError:
        return None


def read_listed(name: str, dir_fd: int) -> bytes | None:
    """The whole of ``name`` in the caller's own directory, which its listing found to be
    a regular file (or a link to one inside it) a moment ago; None unless it still is.

    One call fewer than :func:`read`: the name is opened without following a link (a
    link, which the listing followed, is read as :func:`read` reads it) and non-blocking,
    so a FIFO put in its place since the listing does not block; its type and size are
    then read from the open descriptor. A device node is never made by an unprivileged
    process, so an upload opens only what its user could already make.
    """
    try:
        fd = os.open(name, _READ_FLAGS | _NOFOLLOW, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in _LINK_ERRORS:
            return read(name, dir_fd, None, True)
        return None
    try:
        opened = os.fstat(fd)
        return _read_whole(fd, opened.st_size) if _wanted(opened, None) else None
    except OSError:
        return None
    finally:
        os.close(fd)


def _wanted(info: os.stat_result, expected: int | None) -> bool:
    return stat.S_ISREG(info.st_mode) and info.st_size <= SMALL_FILE_BYTES and (
        expected is None or info.st_size == expected)


def _read_whole(fd: int, size: int) -> bytes | None:
    # A read of a regular file returns less than asked for only at its end: one call of
    # size + 1 both reads it and shows that it ends there.
    data = os.read(fd, size + 1)
    while len(data) < size:
        more = os.read(fd, size + 1 - len(data))
        if not more:
            break
        data += more
    return data if len(data) == size else None


def write(name: str, dir_fd: int, data: bytes, flags: int) -> bool:
    try:
        fd = os.open(name, flags, 0o666, dir_fd=dir_fd)
    except OSError:
        return False
    try:
        written = os.write(fd, data)
        if written < len(data):  # A short write: rare, so no view unless it happens.
            view = memoryview(data)[written:]
            while view:
                view = view[os.write(fd, view):]
    except OSError:
        os.close(fd)
        unlink(name, dir_fd)
        return False
    os.close(fd)
    return True


def unlink(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


class StarterGone(Exception):
    """The process that asked for this share is gone: stop, and answer nothing."""


class _Starter:
    """Raises :class:`StarterGone` once the process that asked for this share (pid
    ``starter``) is gone: at once when it is already, then when this process's parent
    changes. Never raises in the process that asked (``starter`` None)."""

    def __init__(self, starter: int | None) -> None:
        self._parent = None if starter is None else os.getppid()
        self._count = 0
        if starter is not None and self._parent != starter and not _running(starter):
            raise StarterGone  # Orphaned before it started (not merely started by a wrapper).

    def check(self) -> None:
        self._count += 1
        if self._parent is not None and not self._count % _CHECK_EVERY and (
                os.getppid() != self._parent):
            raise StarterGone


def _running(pid: int) -> bool:
    # As the lease's check of its holder (this module imports nothing of cairn's).
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass  # Someone else's process now, or not ours to signal: it exists.
    return True


def upload_share(local_dir: str, dest_root: str, groups: Sequence[Group], *,
                 progress: Callable[[int], None], starter: int | None = None,
                 ) -> tuple[Entries, list[str]]:
    """Copy ``groups`` of names (files listed under ``local_dir``, whose links are then
    followed) to the same paths under ``dest_root``, whose directories exist, hashing
    each. Returns (relpath -> (size, checksum) of the files copied, the files left)."""
    entries: Entries = {}
    left: list[str] = []
    alive = _Starter(starter)
    for directory, names in groups:
        done = 0
        with _directories(local_dir, dest_root, directory, follow_links=True) as pair:
            if pair is None:
                left.extend(relpath(directory, name) for name in names)
                continue
            source, target = pair
            for name in names:
                alive.check()
                rel = f"{directory}/{name}" if directory else name
                data = read_listed(name, source)
                if data is None or not write(name, target, data, TRUNCATE_FLAGS):
                    left.append(rel)
                    continue
                entries[rel] = (len(data), hexdigest(data))
                done += len(data)
        progress(done)
    return entries, left


def download_share(src_root: str, staging: str, groups: Sequence[Group], *,
                   progress: Callable[[int], None],
                   starter: int | None = None) -> tuple[Entries, list[str]]:
    """Copy ``groups`` of ``(name, size, checksum or None)`` from the checkpoint directory
    ``src_root`` (no link followed) to ``staging``, a staging directory whose directories
    exist, which no one else writes in and which is moved into place only once complete.
    Each file is read only if it is a regular file of its size, compared with its
    checksum when one is given, and written under its own name, which nothing there may
    have yet. Returns (relpath -> (size, checksum given or "") of the files copied, the
    files left)."""
    copied: Entries = {}
    left: list[str] = []
    alive = _Starter(starter)
    for directory, items in groups:
        done = 0
        with _directories(src_root, staging, directory, follow_links=False) as pair:
            if pair is None:
                left.extend(relpath(directory, item[0]) for item in items)
                continue
            source, target = pair
            for name, size, checksum in items:
                alive.check()
                data = read(name, source, size, False)
                if data is None or (checksum is not None and hexdigest(data) != checksum):
                    left.append(relpath(directory, name))
                    continue
                if not write(name, target, data, NEW_FLAGS):
                    left.append(relpath(directory, name))
                    continue
                copied[relpath(directory, name)] = (size, checksum or "")
                done += size
        progress(done)
    return copied, left


def hash_share(root: str, groups: Sequence[Group], *, follow_links: bool,
               starter: int | None = None) -> tuple[Entries, list[str]]:
    """Read and hash ``groups`` of ``(name, size or None, checksum or None)`` under
    ``root`` in place. A file whose size or checksum differs from the one given is left.
    Returns (relpath -> (size, checksum) of the files read, the files left)."""
    entries: Entries = {}
    left: list[str] = []
    alive = _Starter(starter)
    for directory, items in groups:
        with opened_directory(root, directory, follow_links=follow_links) as source:
            if source is None:
                left.extend(relpath(directory, item[0]) for item in items)
                continue
            for name, size, want in items:
                alive.check()
                data = read(name, source, size, follow_links)
                if data is None:
                    left.append(relpath(directory, name))
                    continue
                checksum = hexdigest(data)
                if want is not None and checksum != want:
                    left.append(relpath(directory, name))
                    continue
                entries[relpath(directory, name)] = (len(data), checksum)
    return entries, left


def run_share(request: tuple[Any, ...], progress: Callable[[int], None],
              ) -> tuple[Entries, list[str]]:
    """Do ``request`` ``(operation, starter pid or None, ...)``, as the calling thread
    (starter None) or a copy process asked by ``starter``: (entries of the files
    finished, the files left). Raises :class:`StarterGone`."""
    operation, starter, *args = request
    if operation == "upload":
        local_dir, dest_root, groups = args
        return upload_share(local_dir, dest_root, groups, progress=progress, starter=starter)
    if operation == "download":
        src_root, staging, groups = args
        return download_share(src_root, staging, groups, progress=progress, starter=starter)
    if operation == "hash":
        root, groups, follow_links = args
        return hash_share(root, groups, follow_links=follow_links, starter=starter)
    raise ValueError(f"unknown operation {operation!r}")


# The exit status of a copy process that stopped because its starter is gone.
STOPPED = 75


def main() -> None:
    request = marshal.loads(sys.stdin.buffer.read())
    done = [0]

    def count(delta: int) -> None:
        done[0] += delta

    try:
        entries, left = run_share(request, count)
    except StarterGone:
        sys.exit(STOPPED)
    sys.stdout.buffer.write(marshal.dumps((entries, left, done[0])))
    sys.stdout.buffer.flush()


if __name__ == "__main__":
    main()
