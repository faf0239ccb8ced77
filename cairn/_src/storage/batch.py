"""Small files between local directories, a directory at a time: the fast path of the
directory transfers in :mod:`.transfer`.

A transfer task per file costs tens of microseconds of Python around a kilobyte of data
(retry wrappers, a pooled buffer, a streaming hasher, a component-by-component walk of the
path). Here the files of one directory share one walk: the directory is opened once
(every component below the checkpoint directory with ``O_NOFOLLOW``, as the bounded
reader of :mod:`.reader` does) and each file is checked, read whole, hashed and written
with a fixed sequence of calls on that directory's descriptor.

This path only ever finishes the expected case. A file it cannot finish as expected (a
link, a FIFO or device, a size or checksum that differs, a file larger than
:data:`SMALL_FILE_BYTES`, any OS error) is handed back untouched, and the per-file path
checks it again, retries it and reports it in its own words. So nothing here raises for
a file, or decides that one is damaged, and what it accepts the per-file path accepts too.

Not thread-safe per call (one caller thread per call); calls may run concurrently.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager

import xxhash

from cairn._src.storage.checksum import CHECKSUM_ALGORITHM, FileEntry
from cairn._src.storage.fileio import TEMPORARY_MARK

__all__ = ["SMALL_FILE_BYTES", "available", "check_sizes", "download", "hash_files", "upload"]

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
# O_EXCL | O_NOFOLLOW: never write through something that already has the temporary name.
_NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
# An upload's destination is not committed yet: a retry truncates what a failed try wrote,
# and a link planted under the name is not written through.
_TRUNCATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW | _CLOEXEC

_hexdigest: Callable[[bytes], str] = xxhash.xxh3_128_hexdigest


def available() -> bool:
    """Whether this platform has what the fast path needs (directory descriptors)."""
    return bool(
        _NOFOLLOW and _DIRECTORY and os.open in os.supports_dir_fd
        and os.stat in os.supports_dir_fd and os.rename in os.supports_dir_fd
        and CHECKSUM_ALGORITHM == "xxh3_128"
    )


def _by_directory(rels: Iterable[str]) -> dict[str, list[tuple[str, str]]]:
    """``directory -> [(name, rel)]`` for checked relative paths, in first-seen order."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for rel in rels:
        directory, _, name = rel.rpartition("/")
        groups.setdefault(directory, []).append((name, rel))
    return groups


@contextmanager
def _directory(root: str, directory: str, *, follow_links: bool) -> Iterator[int | None]:
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
    """Descriptors of ``directory`` under ``source_root`` (see :func:`_directory`) and
    under ``target_root`` (links followed: a user's path), or None if either cannot be
    opened."""
    target_dir = os.path.join(target_root, *directory.split("/")) if directory else target_root
    with (_directory(source_root, directory, follow_links=follow_links) as source,
          _directory(target_dir, "", follow_links=True) as target):
        yield None if source is None or target is None else (source, target)


def _read(name: str, dir_fd: int, expected: int | None, follow_links: bool) -> bytes | None:
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


def _read_listed(name: str, dir_fd: int) -> bytes | None:
    """The whole of ``name`` in the caller's own directory, which its listing found to be
    a regular file (or a link to one inside it) a moment ago; None unless it still is.

    One call fewer than :func:`_read`: the name is opened without following a link (a
    link, which the listing followed, is read as :func:`_read` reads it) and non-blocking,
    so a FIFO put in its place since the listing does not block; its type and size are
    then read from the open descriptor. A device node is never made by an unprivileged
    process, so an upload opens only what its user could already make.
    """
    try:
        fd = os.open(name, _READ_FLAGS | _NOFOLLOW, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in _LINK_ERRORS:
            return _read(name, dir_fd, None, True)
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


def _write(name: str, dir_fd: int, data: bytes, flags: int) -> bool:
    try:
        fd = os.open(name, flags, 0o666, dir_fd=dir_fd)
    except OSError:
        return False
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError:
        os.close(fd)
        _unlink(name, dir_fd)
        return False
    os.close(fd)
    return True


def _unlink(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


def _matches(data: bytes, want: FileEntry | int) -> bool:
    if isinstance(want, FileEntry):
        return _hexdigest(data) == want.checksum
    return True


def download(
    src_root: str,
    local_dir: str,
    files: Mapping[str, FileEntry | int],
    *,
    verify: bool,
    progress: Callable[[int], None],
) -> set[str]:
    """Copy the small ``files`` (checked relpath -> expected entry or size) from the
    checkpoint directory ``src_root`` into ``local_dir``, whose directories exist.

    With ``verify`` the checksum of an entry is compared. Each file is written under a
    temporary name in its directory and renamed once complete and verified. Returns the
    files not copied, for the per-file path.
    """
    left: set[str] = set()
    prefix = f"{TEMPORARY_MARK}{secrets.token_hex(3)}"
    count = 0
    for directory, names in _by_directory(files).items():
        done = 0
        with _directories(src_root, local_dir, directory, follow_links=False) as pair:
            if pair is None:
                left.update(rel for _, rel in names)
                continue
            source, target = pair
            for name, rel in names:
                want = files[rel]
                size = want.size if isinstance(want, FileEntry) else want
                data = _read(name, source, size, False)
                if data is None or (verify and not _matches(data, want)):
                    left.add(rel)
                    continue
                count += 1
                temporary = f"{prefix}{count:06x}"
                if not _write(temporary, target, data, _NEW_FLAGS):
                    left.add(rel)
                    continue
                try:
                    os.rename(temporary, name, src_dir_fd=target, dst_dir_fd=target)
                except OSError:
                    _unlink(temporary, target)
                    left.add(rel)
                    continue
                done += size
        progress(done)
    return left


def hash_files(
    root: str,
    files: Mapping[str, FileEntry | None],
    *,
    follow_links: bool = False,
) -> tuple[dict[str, FileEntry], set[str]]:
    """Read and hash the small ``files`` (checked relpath -> expected entry or None)
    under the local directory ``root``, in place.

    Returns (the entries of the files read as expected, the files left for the per-file
    path): a file whose checksum differs from its expected entry is left, not judged.
    """
    entries: dict[str, FileEntry] = {}
    left: set[str] = set()
    for directory, names in _by_directory(files).items():
        with _directory(root, directory, follow_links=follow_links) as source:
            if source is None:
                left.update(rel for _, rel in names)
                continue
            for name, rel in names:
                want = files[rel]
                data = _read(name, source, None if want is None else want.size, follow_links)
                if data is None:
                    left.add(rel)
                    continue
                checksum = _hexdigest(data)
                if want is not None and checksum != want.checksum:
                    left.add(rel)
                    continue
                entries[rel] = FileEntry(size=len(data), checksum=checksum)
    return entries, left


def upload(
    local_dir: str,
    dest_root: str,
    names: Iterable[str],
    *,
    progress: Callable[[int], None],
) -> tuple[dict[str, FileEntry], set[str]]:
    """Copy the small files ``names`` (checked relpaths, already listed by
    :func:`~cairn._src.storage.paths.list_local_files`, whose links are then followed)
    of ``local_dir`` to the local directory ``dest_root``, whose directories exist.

    Returns (the entries of the files copied, the files left for the per-file path).
    """
    entries: dict[str, FileEntry] = {}
    left: set[str] = set()
    for directory, group in _by_directory(names).items():
        done = 0
        with _directories(local_dir, dest_root, directory, follow_links=True) as pair:
            if pair is None:
                left.update(rel for _, rel in group)
                continue
            source, target = pair
            for name, rel in group:
                data = _read_listed(name, source)
                if data is None or not _write(name, target, data, _TRUNCATE_FLAGS):
                    left.add(rel)
                    continue
                entries[rel] = FileEntry(size=len(data), checksum=_hexdigest(data))
                done += len(data)
        progress(done)
    return entries, left


def check_sizes(root: str, sizes: Mapping[str, int]) -> set[str]:
    """The files of ``sizes`` (checked relpath -> size) under the checkpoint directory
    ``root`` that are not a regular file of that size reached without a link: left for
    the per-file path. Nothing is opened or read (a FIFO or device is never opened).
    """
    left: set[str] = set()
    for directory, names in _by_directory(sizes).items():
        with _directory(root, directory, follow_links=False) as source:
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
