"""Relative paths inside a checkpoint, and listing of local checkpoint directories.

A checkpoint is a directory of files named by relative ``/``-separated paths. Those names
come from user code, from other ranks and from manifests read back from storage, so every
name is checked here before Cairn joins it to a destination: a name must never lead a
write or a read outside the checkpoint directory.
"""

from __future__ import annotations

import logging
import os
import posixpath
import socket
import stat
from collections.abc import Collection

from cairn._src.errors import (
    CheckpointNotFoundError,
    NotADirectoryCheckpointError,
    StorageError,
    UnsafePathError,
)

logger = logging.getLogger(__name__)


def check_relative_path(rel: str, *, argument: str = "path") -> str:
    """Return ``rel`` normalized to ``a/b/c`` form, or raise :class:`UnsafePathError`.

    Accepted: a non-empty relative path of ``/``-separated components. ``.`` components,
    repeated and trailing slashes are dropped. Refused: absolute paths, ``..`` components,
    backslashes and NUL characters (a backslash is a separator on Windows, and a NUL ends
    the name early in C APIs, so either could make two different checks disagree).
    ``argument`` names the offending argument in the error message.
    """
    if not isinstance(rel, str):
        raise UnsafePathError(
            f"{argument}={rel!r} must be a str, got {type(rel).__name__}; "
            "pass a relative path such as 'model/weights.pt'."
        )
    if _is_plain(rel):
        return rel
    if "\\" in rel or "\x00" in rel:
        raise UnsafePathError(
            f"{argument}={rel!r} contains a backslash or NUL character; use '/' to "
            "separate directories and plain characters in names."
        )
    if rel.startswith("/"):
        raise UnsafePathError(
            f"{argument}={rel!r} is an absolute path; pass a path relative to the "
            "checkpoint directory, such as 'model/weights.pt'."
        )
    parts = [part for part in rel.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise UnsafePathError(
            f"{argument}={rel!r} contains a '..' component, which would leave the "
            "checkpoint directory; name files inside it only."
        )
    if not parts:
        raise UnsafePathError(
            f"{argument}={rel!r} names no file; pass a non-empty relative path."
        )
    return "/".join(parts)


def is_normal_relative_path(rel: str) -> bool:
    """Whether ``rel`` is accepted by :func:`check_relative_path` unchanged (already in
    normal form); never raises."""
    if _is_plain(rel):
        return True
    try:
        return check_relative_path(rel) == rel
    except UnsafePathError:
        return False


def are_normal_relative_paths(names: Collection[str]) -> bool:
    """Whether every one of ``names`` is a str that :func:`is_normal_relative_path`
    accepts, decided by a few scans of them all joined, not name by name (a manifest of
    100,000 files). False when one is not, and also when a name holds a newline: the
    caller then checks each name, and names the one that is wrong."""
    if not names:
        return True
    try:
        joined = "\n".join(names)
    except TypeError:  # Not all of them are str.
        return False
    if joined.count("\n") != len(names) - 1 or "\\" in joined or "\x00" in joined:
        return False
    # Every name between slashes: a component that is empty, "." or ".." shows as one of
    # these (a scan each, far faster than a regular expression tried at every position).
    slashed = "/" + joined.replace("\n", "/") + "/"
    return "//" not in slashed and "/./" not in slashed and "/../" not in slashed


def _is_plain(rel: str) -> bool:
    """Whether ``rel`` is already normalized and safe, decided without splitting it (a
    manifest checks every one of its paths): no component is empty or starts with a dot,
    so none is ``.`` or ``..``; no backslash or NUL; not absolute. Anything else takes the
    full check."""
    return bool(rel) and rel[0] not in "/." and rel[-1] != "/" and "/." not in rel and (
        "//" not in rel) and "\\" not in rel and "\x00" not in rel


def _readable(info: os.stat_result, path: str) -> bool:
    """Whether this process may read the file ``path`` (``info``: its stat), as
    :func:`os.access` answers, without its system call in the common case: the owner's
    permission is the mode's owner bits (an access control list does not change them)."""
    getuid = getattr(os, "getuid", None)  # POSIX only
    if getuid is not None and info.st_uid == getuid() and info.st_mode & stat.S_IRUSR:
        return True
    return os.access(path, os.R_OK)


def check_absolute_path(value: object, *, argument: str = "path") -> str:
    """Return ``value`` if it is a normalized absolute ``/``-separated path, else raise.

    Accepted: a str that starts with ``/``, with no empty, ``.`` or ``..`` component, no
    trailing slash, no backslash and no NUL (``/a/b``). Such a path names one location on
    a storage filesystem object without any resolution step that could disagree with a
    later check. Raises :class:`UnsafePathError` naming ``argument``.
    """
    if not isinstance(value, str):
        raise UnsafePathError(
            f"{argument}={value!r} must be a str, got {type(value).__name__}; pass an "
            "absolute '/'-separated path such as '/data/ckpt'."
        )
    if (
        not value.startswith("/")
        or value.startswith("//")
        or "\\" in value
        or "\x00" in value
        or posixpath.normpath(value) != value
    ):
        raise UnsafePathError(
            f"{argument}={value!r} is not a normalized absolute path; pass an absolute "
            "'/'-separated path with no '.', '..' or empty components, such as '/data/ckpt'."
        )
    return value


def _machine_identity() -> str:
    """This kernel's boot id (shared by every process and container of one boot of one
    machine), or the host name where there is none."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as file:
            return file.read(64).strip()
    except OSError:
        return socket.gethostname()


_MACHINE = _machine_identity()


def local_dir_identity(local_dir: str) -> str | None:
    """Which directory of which machine ``local_dir`` is: equal for two processes exactly
    when they name one directory (any path to it) on one running kernel. None when it
    cannot be read."""
    try:
        info = os.stat(local_dir)
    except OSError:
        return None
    return f"{_MACHINE}:{info.st_dev}:{info.st_ino}"


def list_local_files(local_dir: str) -> dict[str, int]:
    """List every file under ``local_dir``, recursively, as ``relpath -> size``.

    Relative paths use ``/``. Symbolic links that stay inside ``local_dir`` are followed and
    listed as the files they point to; one that points outside it raises
    :class:`UnsafePathError`, because uploading it would copy data the user did not put in
    the checkpoint. Raises :class:`CheckpointNotFoundError` when ``local_dir`` is missing,
    :class:`NotADirectoryCheckpointError` when it is a file, and :class:`StorageError`
    naming the file when something under it cannot be read. Special files (FIFOs,
    sockets, devices) are refused with :class:`StorageError` since reading them could block
    or never end.
    """
    local_dir = os.fspath(local_dir)
    try:
        top = os.stat(local_dir)
    except FileNotFoundError as exc:
        raise CheckpointNotFoundError(
            f"Checkpoint directory {local_dir!r} does not exist; pass the path of an "
            "existing local directory."
        ) from exc
    except PermissionError as exc:
        raise StorageError(
            f"Checkpoint directory {local_dir!r} cannot be read (permission denied); "
            "make it readable by this process."
        ) from exc
    if not stat.S_ISDIR(top.st_mode):
        raise NotADirectoryCheckpointError(
            f"Checkpoint path {local_dir!r} is a file, not a directory; pass the directory "
            "that contains the checkpoint files."
        )
    root_real = os.path.realpath(local_dir)
    files: dict[str, int] = {}
    _walk(local_dir, "", root_real, files, seen_dirs={root_real})
    return files


def _walk(
    directory: str, prefix: str, root_real: str, files: dict[str, int], seen_dirs: set[str]
) -> None:
    try:
        entries = list(os.scandir(directory))
    except PermissionError as exc:
        raise StorageError(
            f"Directory {directory!r} in the checkpoint cannot be listed (permission "
            "denied); make it readable by this process."
        ) from exc
    for entry in entries:
        rel = f"{prefix}{entry.name}"
        path = entry.path
        if entry.is_symlink():
            target = os.path.realpath(path)
            if os.path.commonpath([root_real, target]) != root_real:
                raise UnsafePathError(
                    f"{path!r} is a symbolic link to {target!r}, outside the checkpoint "
                    f"directory {root_real!r}; copy the file into the directory instead of "
                    "linking to it."
                )
        try:
            info = os.stat(path)
        except FileNotFoundError as exc:
            raise StorageError(
                f"{path!r} in the checkpoint vanished or is a broken symbolic link; "
                "remove it or make it point to a file inside the checkpoint."
            ) from exc
        except PermissionError as exc:
            raise StorageError(
                f"{path!r} in the checkpoint cannot be read (permission denied); make it "
                "readable by this process."
            ) from exc
        if stat.S_ISDIR(info.st_mode):
            real = os.path.realpath(path)
            if real in seen_dirs:
                # A link back to an ancestor would make the walk endless.
                raise UnsafePathError(
                    f"{path!r} is a symbolic link that loops back to {real!r}; remove it."
                )
            _walk(path, f"{rel}/", root_real, files, seen_dirs | {real})
        elif stat.S_ISREG(info.st_mode):
            if not _readable(info, path):
                raise StorageError(
                    f"{path!r} in the checkpoint cannot be read (permission denied); make "
                    "it readable by this process."
                )
            files[rel] = info.st_size
        else:
            raise StorageError(
                f"{path!r} in the checkpoint is not a regular file (a FIFO, socket or "
                "device); checkpoints may contain regular files and directories only.",
            )
