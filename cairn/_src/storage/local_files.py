"""Local files a transfer writes: fresh temporaries, files created without following a
link, and a download's staging directory moved into its target.

Every file is created with ``O_NOFOLLOW`` (and ``O_EXCL`` where it must be new), so a
link planted under a name is never written through; a temporary's name is short
whatever the final name's length. Thread-safe: no shared state.
"""

from __future__ import annotations

import errno
import io
import logging
import os
import shutil
import uuid
from collections.abc import Iterable

from cairn._src.storage.fileio import TEMPORARY_MARK

logger = logging.getLogger(__name__)


def check_nothing_in_the_way(local_dir: str, parents: Iterable[str],
                             files: Iterable[str] = ()) -> None:
    """Raise :class:`FileExistsError` before anything is downloaded when something that
    is not a directory has the name of a directory of the checkpoint in ``local_dir``, or
    a directory (not a link to one) has the name of one of its ``files``: the files moved
    into place before it would have replaced the user's."""
    ancestors = {parent[:cut] for parent in parents
                 for cut in [i for i, c in enumerate(parent) if c == "/"] + [len(parent)]}
    for ancestor in sorted(ancestors):
        path = os.path.join(local_dir, *ancestor.split("/"))
        if os.path.lexists(path) and not os.path.isdir(path):
            raise FileExistsError(
                errno.EEXIST, f"Cannot download into {local_dir!r}: {ancestor!r} is a "
                "directory of the checkpoint, and something else has its name there", path)
    for rel in sorted(files):
        path = os.path.join(local_dir, *rel.split("/"))
        if os.path.isdir(path) and not os.path.islink(path):
            raise FileExistsError(
                errno.EEXIST, f"Cannot download into {local_dir!r}: {rel!r} is a file of "
                "the checkpoint, and a directory has its name there", path)


def move_into(staging: str, target: str) -> None:
    """Move what ``staging`` holds into the directory ``target`` (see
    :func:`.transfer.download_directory`); a directory of ``target`` may be a user's link to one."""
    with os.scandir(staging) as entries:
        found = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in entries]
    for name, is_dir in found:
        source, destination = os.path.join(staging, name), os.path.join(target, name)
        if is_dir and os.path.isdir(destination):
            move_into(source, destination)
            continue
        try:
            os.replace(source, destination)
        except OSError as exc:
            if is_dir and exc.errno in (errno.ENOTEMPTY, errno.EEXIST) and os.path.isdir(
                    destination):
                move_into(source, destination)  # made there meanwhile: merge into it
            elif exc.errno == errno.EXDEV:
                copy_into(source, destination, is_dir)  # another file system under target
            else:
                raise


def copy_into(source: str, destination: str, is_dir: bool) -> None:
    """:func:`move_into` across file systems: a file copied to a temporary next to
    ``destination`` and renamed, a directory made and filled."""
    if is_dir:
        os.makedirs(destination, exist_ok=True)
        move_into(source, destination)
        return
    temporary = temporary_sibling(destination)
    try:
        shutil.copyfile(source, temporary, follow_symlinks=False)
        os.replace(temporary, destination)
    except BaseException:
        remove_local(temporary)
        raise


def temporary_sibling(final: str) -> str:
    """A fresh name next to ``final`` that fits wherever ``final`` does.

    Short (23 characters) whatever the final name's length: a suffix on a legal
    255-byte name would exceed the file system's name limit (ENAMETOOLONG).
    """
    return os.path.join(os.path.dirname(final), f"{TEMPORARY_MARK}{uuid.uuid4().hex[:12]}")


def create_or_truncate(path: str) -> io.FileIO:
    # O_NOFOLLOW: never write through a link planted under this name (a retry of the same
    # file truncates what the failed try wrote).
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
    flags |= getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    return io.FileIO(os.open(path, flags, 0o666), "wb", closefd=True)


def create_new(path: str) -> io.FileIO:
    # O_EXCL | O_NOFOLLOW: never write through something that already has this name.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    flags |= getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    return io.FileIO(os.open(path, flags, 0o666), "wb", closefd=True)


def remove_local(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
