"""The one bounded, typed reader behind every verification, restore and read-back.

Storage is untrusted input. A file a manifest lists may since have been replaced by a
symbolic link (to ``/dev/zero``, to ``/etc/passwd``), a FIFO, a device or a directory, or
it may have grown. Every read of checkpoint data goes through :func:`open_regular_file`,
and every whole-file read of Cairn's own small files through :func:`read_small_file`:

* Only regular files are read, and that is decided before anything is read. On local
  storage every path component below the checkpoint directory is checked with ``lstat``
  and opened with ``O_NOFOLLOW`` (a link is never followed out of the directory), the file
  is opened with ``O_NONBLOCK`` (a FIFO cannot block the open) and checked again with
  ``fstat`` on the open descriptor (nothing can be swapped in between). Elsewhere the
  backend's ``get_file_info`` type must be ``File``.
* The stored size is compared with the expected one first: a mismatch is reported without
  reading the file.
* The caller reads at most the expected size plus one byte (the ``limit`` returned), so a
  file that grows meanwhile is a mismatch too, never an endless read.

Errors: :class:`MissingCheckpointFileError`, :class:`NotARegularFileError` and
:class:`ChecksumMismatchError`, all :class:`CheckpointDamagedError`; other failures are
the backend's own exceptions, for the caller's retry and conversion.
"""

from __future__ import annotations

import errno
import io
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs

from cairn._src.errors import (
    ChecksumMismatchError,
    ManifestError,
    MissingCheckpointFileError,
    NotARegularFileError,
)
from cairn._src.storage.location import StorageLocation, local_root
from cairn._src.storage.uris import local_os_join

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_FILE_FLAGS = os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC | getattr(os, "O_BINARY", 0)
_DIR_FLAGS = os.O_RDONLY | _NOFOLLOW | _DIRECTORY | _NONBLOCK | _CLOEXEC
# Walking with directory descriptors keeps every component check and open on the same
# directory; without dir_fd (Windows) each component is checked by its full path.
_HAS_DIR_FD = os.open in os.supports_dir_fd and os.stat in os.supports_dir_fd and bool(
    _NOFOLLOW
)
# open() with O_NOFOLLOW on a link fails with ELOOP (Linux, macOS) or EMLINK (FreeBSD).
_LINK_ERRNOS = frozenset({errno.ELOOP, errno.EMLINK})


@dataclass(frozen=True)
class OpenedFile:
    """A regular file opened for a bounded read.

    ``stream`` has ``readinto``; ``size`` is its stored size (None where the backend does
    not say); read at most ``limit`` bytes from it (None: the backend gave no size and the
    caller expected none). Reading more than the expected size means the file changed.
    """

    stream: Any
    size: int | None
    limit: int | None


def local_os_path(location: StorageLocation) -> str | None:
    """The OS path of ``location`` when it is on the local disk, else None."""
    root = local_root(location.filesystem)
    if root is None:
        return None
    return local_os_join(root, location.path)


def describe_mode(mode: int) -> str:
    """What kind of file ``st_mode`` is, for messages."""
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


@contextmanager
def open_regular_file(
    directory: StorageLocation, rel: str, *, expected_size: int | None,
    follow_links: bool = False, random_access: bool = False, committed: bool | None = None,
) -> Iterator[OpenedFile]:
    """Open ``rel`` (a checked relative path) under ``directory`` for a bounded read.

    With ``expected_size`` a stored size that differs raises
    :class:`ChecksumMismatchError` before any byte is read, and ``limit`` is
    ``expected_size + 1``. Without it ``limit`` is the stored size plus one. Raises
    :class:`MissingCheckpointFileError` when the file (or a parent) does not exist and
    :class:`NotARegularFileError` when it, or a directory on its way, is a symbolic link,
    or it is a directory, a FIFO, a socket or a device. ``follow_links`` is for a user's
    local directory that is not a committed checkpoint, whose links
    :func:`~cairn._src.storage.paths.list_local_files` already checked to stay inside it:
    links are then followed, and the file they lead to must still be a regular file.
    ``random_access``: on remote storage the stream is a random-access file (``read_at``,
    for ranged reads in parallel) rather than a sequential stream. ``committed``: whether
    ``directory`` is a committed checkpoint, for the words of the errors (a file gone
    after its commit is damage; one gone while it is read for a commit was taken away
    from a checkpoint still being reported); by default it is when ``expected_size`` is
    given, the size a manifest records, and not for a file read to be committed.
    """
    if committed is None:
        committed = expected_size is not None
    root = local_os_path(directory)
    if root is not None:
        if follow_links:
            fd, size = _open_following(os.path.join(root, *rel.split("/")), directory, rel,
                                       committed)
        else:
            fd, size = _open_local(root, rel, directory, committed)
        stream = io.FileIO(fd, "rb", closefd=True)
        with stream:
            _check_size(directory, rel, expected_size, size, committed)
            limit = (expected_size if expected_size is not None else size) + 1
            yield OpenedFile(stream, size, limit)
        return
    source = directory.join(rel)
    info = directory.filesystem.get_file_info(source.path)
    if info.type == pafs.FileType.NotFound:
        raise _missing(directory, rel, committed)
    if info.type != pafs.FileType.File:
        kind = "a directory" if info.type == pafs.FileType.Directory else "not a regular file"
        raise _not_regular(directory, rel, kind, committed)
    stored = None if info.size is None else int(info.size)
    if stored is not None:
        _check_size(directory, rel, expected_size, stored, committed)
    bound = expected_size if expected_size is not None else stored
    fs = directory.filesystem
    with (fs.open_input_file(source.path) if random_access
          else fs.open_input_stream(source.path)) as stream:
        yield OpenedFile(stream, stored, None if bound is None else bound + 1)


def _check_size(directory: StorageLocation, rel: str, expected: int | None, size: int,
                committed: bool) -> None:
    if expected is not None and size != expected:
        when = "after it was committed" if committed else "after Cairn listed it"
        raise ChecksumMismatchError(
            f"File {rel!r} of {directory.display()} is corrupt: expected {expected} bytes, "
            f"storage holds {size}. The file was changed or truncated {when}."
        )


def _missing(directory: StorageLocation, rel: str, committed: bool) -> MissingCheckpointFileError:
    """The error of a file of ``directory`` that is gone; ``committed``: whether
    ``directory`` is a committed checkpoint, or one Cairn reads to commit it."""
    if committed:
        return MissingCheckpointFileError(
            f"File {rel!r} of {directory.display()} does not exist: it was deleted after the "
            "checkpoint was committed."
        )
    return MissingCheckpointFileError(
        f"File {rel!r} of {directory.display()} does not exist: it was deleted after Cairn "
        "listed the checkpoint's files, before the checkpoint was committed. Finish "
        "writing a checkpoint before reporting it, and leave it in place until it is "
        "committed."
    )


def _not_regular(
    directory: StorageLocation, rel: str, kind: str, committed: bool,
    component: str | None = None,
) -> NotARegularFileError:
    if component is not None and component != rel:
        what = f"the directory {component!r} on the way to file {rel!r}"
    else:
        what = f"file {rel!r}"
    changed = " The checkpoint was changed after it was committed." if committed else ""
    return NotARegularFileError(
        f"In {directory.display()}, {what} is {kind}; Cairn reads regular files only, so it "
        f"neither follows links nor reads FIFOs or devices.{changed}"
    )


def _open_local(root: str, rel: str, directory: StorageLocation,
                committed: bool) -> tuple[int, int]:
    """(descriptor, size) of the regular file ``rel`` under the local directory ``root``."""
    parts = rel.split("/")
    if not _HAS_DIR_FD:
        return _open_local_by_path(root, parts, rel, directory, committed)
    try:
        # O_NONBLOCK: even a FIFO in the checkpoint directory's place cannot block.
        dir_fd = os.open(root, os.O_RDONLY | _DIRECTORY | _NONBLOCK | _CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        raise _missing(directory, rel, committed) from None
    try:
        for position, part in enumerate(parts):
            component = "/".join(parts[: position + 1])
            try:
                info = os.stat(part, dir_fd=dir_fd, follow_symlinks=False)
            except (FileNotFoundError, NotADirectoryError):
                raise _missing(directory, rel, committed) from None
            last = position == len(parts) - 1
            if stat.S_ISLNK(info.st_mode) or (last and not stat.S_ISREG(info.st_mode)):
                raise _not_regular(directory, rel, describe_mode(info.st_mode), committed,
                                   component)
            if not last:
                if not stat.S_ISDIR(info.st_mode):
                    # 'x' is a file where the manifest lists 'x/y': 'x/y' is gone.
                    raise _missing(directory, rel, committed)
                next_fd = _open_at(part, _DIR_FLAGS, dir_fd, directory, rel, component,
                                   committed)
                os.close(dir_fd)
                dir_fd = next_fd
                continue
            fd = _open_at(part, _FILE_FLAGS, dir_fd, directory, rel, component, committed)
            opened = os.fstat(fd)
            if not stat.S_ISREG(opened.st_mode) or (opened.st_dev, opened.st_ino) != (
                info.st_dev, info.st_ino
            ):
                os.close(fd)
                raise _not_regular(directory, rel, "replaced while it was opened", committed)
            return fd, opened.st_size
    finally:
        os.close(dir_fd)
    raise AssertionError("unreachable: a relative path has at least one component")


def _open_at(
    part: str, flags: int, dir_fd: int, directory: StorageLocation, rel: str, component: str,
    committed: bool,
) -> int:
    try:
        return os.open(part, flags, dir_fd=dir_fd)
    except (FileNotFoundError, NotADirectoryError):
        raise _missing(directory, rel, committed) from None
    except OSError as exc:
        if exc.errno in _LINK_ERRNOS:
            # Swapped for a link between the lstat and the open.
            raise _not_regular(directory, rel, "a symbolic link", committed,
                               component) from None
        raise


def _open_following(path: str, directory: StorageLocation, rel: str,
                    committed: bool) -> tuple[int, int]:
    try:
        fd = os.open(path, _FILE_FLAGS & ~_NOFOLLOW)
    except (FileNotFoundError, NotADirectoryError):
        raise _missing(directory, rel, committed) from None
    opened = os.fstat(fd)
    if not stat.S_ISREG(opened.st_mode):
        os.close(fd)
        raise _not_regular(directory, rel, describe_mode(opened.st_mode), committed)
    return fd, opened.st_size


def _open_local_by_path(
    root: str, parts: list[str], rel: str, directory: StorageLocation, committed: bool
) -> tuple[int, int]:
    path = root
    for position, part in enumerate(parts):
        path = os.path.join(path, part)
        try:
            info = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            raise _missing(directory, rel, committed) from None
        last = position == len(parts) - 1
        component = "/".join(parts[: position + 1])
        if stat.S_ISLNK(info.st_mode) or (last and not stat.S_ISREG(info.st_mode)):
            raise _not_regular(directory, rel, describe_mode(info.st_mode), committed,
                               component)
        if not last and not stat.S_ISDIR(info.st_mode):
            raise _missing(directory, rel, committed)
    fd = os.open(path, _FILE_FLAGS)
    opened = os.fstat(fd)
    if not stat.S_ISREG(opened.st_mode):
        os.close(fd)
        raise _not_regular(directory, rel, describe_mode(opened.st_mode), committed)
    return fd, opened.st_size


def read_small_file(location: StorageLocation, *, limit: int) -> bytes:
    """The whole content of the file at ``location``, which may hold at most ``limit`` bytes.

    For Cairn's own files (manifests, the index, the lease, log segments, metadata). On
    local storage a link is followed (the file need not sit inside a checkpoint), but the
    result must be a regular file, opened without blocking and checked before the read;
    elsewhere at most ``limit + 1`` bytes are requested. Raises ``FileNotFoundError`` when
    it is missing, and :class:`ManifestError` (damage: Cairn never wrote such a file) for
    a directory, a FIFO or a device, a symbolic link loop (the file, or a directory on its
    way, is a link that leads back to itself), or when it is larger than ``limit``. A
    file this process may not read (``PermissionError``) is no damage: its error is raised
    as it is, for the caller to report as an access problem.
    """
    path = local_os_path(location)
    if path is None:
        with location.filesystem.open_input_stream(location.path) as stream:
            data = _read_up_to(stream, limit + 1)
        if len(data) > limit:
            raise _too_large(location, limit)
        return data
    try:
        fd = os.open(path, _FILE_FLAGS & ~_NOFOLLOW)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise  # PermissionError among them: an access problem, not damage
        raise _link_loop(location, path) from exc
    # Checked before io.FileIO takes it: FileIO refuses a directory with its own error.
    try:
        info = os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise ManifestError(
            f"{location.display()} is {describe_mode(info.st_mode)}, not a regular file; "
            "Cairn reads regular files only. Replace it with the file Cairn wrote there."
        )
    with io.FileIO(fd, "rb", closefd=True) as stream:
        if info.st_size > limit:
            raise _too_large(location, limit)
        data = _read_up_to(stream, limit + 1)
    if len(data) > limit:
        raise _too_large(location, limit)
    return data


def _link_loop(location: StorageLocation, path: str) -> ManifestError:
    """The damage of ``path`` (``location`` on the local disk) that cannot be opened
    because it, or a directory on its way, is a symbolic link loop; the nearest such link
    is named. Nothing is followed or changed to find it (``lstat`` only)."""
    where = location.display()
    if os.path.islink(path):
        what = (f"{where} is a symbolic link loop (a link that leads back to itself), not a "
                "regular file")
    else:
        parent = os.path.dirname(path)
        while parent != os.path.dirname(parent) and not os.path.islink(parent):
            parent = os.path.dirname(parent)
        link = parent if os.path.islink(parent) else "a directory on its way"
        what = (f"{where} cannot be reached: {link} is a symbolic link loop (a link that "
                "leads back to itself), not a directory")
    return ManifestError(
        f"{what}; Cairn reads regular files only. Remove the link, or replace it with what "
        "Cairn wrote there."
    )


def _read_up_to(stream: Any, most: int) -> bytes:
    """At most ``most`` bytes of ``stream``, read until its end: one ``read`` may return
    fewer bytes than asked (a raw stream of a custom store, a network file system)."""
    chunks: list[bytes] = []
    left = most
    while left > 0:
        chunk = stream.read(left)
        if chunk is None:
            # A non-blocking raw stream with nothing yet: an error the caller retries,
            # never a file that ends here.
            raise BlockingIOError(errno.EAGAIN, "the stream had no data ready; read again")
        if not chunk:
            break
        chunks.append(bytes(chunk))
        left -= len(chunk)
    return b"".join(chunks)


def _too_large(location: StorageLocation, limit: int) -> ManifestError:
    return ManifestError(
        f"{location.display()} holds more than {limit} bytes, more than Cairn ever writes "
        "there; it is not a file Cairn wrote. Remove or replace it."
    )
