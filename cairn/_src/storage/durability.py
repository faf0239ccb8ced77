"""Making what a commit names durable on local and POSIX-mounted storage.

A checkpoint is committed by its manifest (``DESIGN.md``, contract item 4). On a file
system, a written file is in the page cache, not on the disk: a power loss or a kernel
crash after the manifest reached the disk could leave a manifest that names data that
never did. So, on storage with an OS path (:func:`~.reader.local_os_path`), with
``StorageOptions.fsync`` on (the default, ``RunConfig.storage_fsync``):

1. every data file is fsynced, then every directory that holds one, up to and including
   the directory that holds the checkpoint directory (its entry is new too): this is the
   worker's part, before it tells the driver that its files are uploaded
   (:func:`sync_uploaded`);
2. the manifest (and then the run index) is written under a temporary name, fsynced,
   renamed over its final name, and its directory fsynced (:func:`write_durably`).

Object stores make a write durable when it returns: nothing to do there. Turning it off
(``fsync=False``) is for scratch storage (tmpfs, a disk that does not outlive the
machine): a commit then survives a killed process, not a lost machine.

Every fsync goes through ``os.fsync`` looked up at call time, so a test (or a benchmark)
in the same process can record the order of the calls. Thread-safe: no shared state.
"""

from __future__ import annotations

import errno
import logging
import os
import time
import uuid
from collections.abc import Iterable

logger = logging.getLogger(__name__)

# In the name of a manifest or index being written (fileio.TEMPORARY_MARK, repeated here
# because fileio imports this module).
_TEMPORARY_MARK = ".cairn-tmp-"
# What a file system answers when it cannot fsync a directory.
_DIRECTORY_SYNC_REFUSED = frozenset({errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP})
# O_EXCL | O_NOFOLLOW: never write through something that already has the name.
_CREATE_NEW = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
               | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))


def fsync_path(path: str) -> None:
    """fsync the file or directory at ``path`` (opened read-only: Linux flushes an inode's
    dirty pages whatever the mode of the descriptor that asks).

    A directory is skipped where the OS cannot open one (Windows) and where its file
    system refuses to sync one (EINVAL, ENOTSUP: some FUSE and network file systems,
    whose directory operations are synchronous or out of the client's hands).

    A directory is opened through a symbolic link (a ``storage_path`` such as
    ``~/ray_results -> /mnt/nvme/ray_results``): syncing it changes nothing, and it is
    the directory whose entries were written through the link. A file never is
    (``O_NOFOLLOW``): a link in its place is not what was written."""
    is_dir = os.path.isdir(path)
    if is_dir and os.name == "nt":
        return
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
    if is_dir:
        flags |= getattr(os, "O_DIRECTORY", 0)
    else:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    descriptor = os.open(path, flags)
    try:
        os.fsync(descriptor)
    except OSError as exc:
        if not (is_dir and exc.errno in _DIRECTORY_SYNC_REFUSED):
            raise
    finally:
        os.close(descriptor)


def sync_uploaded(root: str, files: Iterable[str]) -> None:
    """Make the ``files`` (``/``-relative paths) written under the directory ``root``
    durable: each file, then each directory that holds one, deepest first, then ``root``
    and the directory that holds it."""
    started = time.perf_counter()
    names = sorted(set(files))
    directories: set[str] = set()
    for rel in names:
        fsync_path(os.path.join(root, *rel.split("/")))
        parent = rel.rpartition("/")[0]
        while parent:
            directories.add(parent)
            parent = parent.rpartition("/")[0]
    for rel in sorted(directories, key=lambda d: (-d.count("/"), d)):
        fsync_path(os.path.join(root, *rel.split("/")))
    fsync_path(root)
    fsync_path(os.path.dirname(root.rstrip("/")) or "/")
    logger.debug("fsynced %d files and %d directories under %s in %.3fs", len(names),
                 len(directories) + 2, root, time.perf_counter() - started)


def write_durably(path: str, data: bytes) -> None:
    """Replace the file at the OS path ``path`` with ``data``, durably: a temporary
    sibling is written, fsynced and renamed over ``path``, then the directory is fsynced.
    A reader sees the old file or the new one, never a part; a crash after this returns
    keeps the new one."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    temporary = f"{path}{_TEMPORARY_MARK}{uuid.uuid4().hex}"
    try:
        descriptor = os.open(temporary, _CREATE_NEW, 0o666)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(descriptor, view):]
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        os.replace(temporary, path)
    except BaseException:
        try:
            os.remove(temporary)
        except FileNotFoundError:
            pass
        raise
    fsync_path(directory)
