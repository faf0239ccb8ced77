"""Small-file operations on a :class:`StorageLocation`, each retried on transient errors.

These are for indexes, manifests, metadata and listings: whole-file reads and writes of a
few kilobytes to megabytes. Bulk data goes through :mod:`cairn._src.storage.transfer`.

Errors: a missing path raises :class:`CheckpointNotFoundError`; any other failure that
outlives its retries (or is permanent) raises :class:`StorageError` naming the location,
with the backend's exception chained.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import uuid
from collections.abc import Callable, Iterable
from typing import TypeVar

import pyarrow.fs as pafs

from cairn._src.errors import CairnError, CheckpointNotFoundError, StorageError
from cairn._src.storage.durability import fsync_path, write_durably
from cairn._src.storage.location import StorageLocation, supports_atomic_rename
from cairn._src.storage.reader import local_os_path, read_small_file
from cairn._src.storage.retry import DEFAULT_RETRY, RetryPolicy, call_with_retry

logger = logging.getLogger(__name__)

T = TypeVar("T")

# In the name of a file being written; one left behind by a crash is garbage.
TEMPORARY_MARK = ".cairn-tmp-"
# The most a small file Cairn reads back may hold (manifests, the index, the lease, log
# segments, metadata): far above what it writes (an index of 100,000 checkpoints is about
# 40 MB), and a bound on what a file swapped in by someone else can make it read.
MAX_SMALL_FILE_BYTES = 256 << 20

_OBJECT_STORE_TYPES = frozenset({"s3", "gcs", "abfs"})


def storage_call(fn: Callable[[], T], loc: StorageLocation, retry: RetryPolicy, what: str) -> T:
    """Run ``fn`` with retries; convert what escapes to Cairn's storage errors.

    ``what`` is a verb phrase for messages ("read", "list"); the location is added.
    """
    try:
        return call_with_retry(fn, retry, what=f"{what} {loc.display()}")
    except CairnError:
        raise
    except (FileNotFoundError, NotADirectoryError) as exc:
        # NotADirectoryError: a parent of the path is a file, so the path cannot exist.
        raise CheckpointNotFoundError(f"{loc.display()} does not exist ({what}).") from exc
    except PermissionError as exc:
        raise StorageError(
            f"Permission denied to {what} {loc.display()}: {exc}. Check the credentials "
            "and access rights for this location."
        ) from exc
    except OSError as exc:
        raise StorageError(f"Could not {what} {loc.display()}: {exc}") from exc


def needs_directories(fs: pafs.FileSystem) -> bool:
    """Whether parent directories must exist before a file is written.

    True for file systems; object stores have no directories and creating markers there
    only costs requests.
    """
    return fs.type_name not in _OBJECT_STORE_TYPES and not fs.type_name.startswith(
        "py::cairn-object-store"
    )


def create_parents(dest: StorageLocation, names: Iterable[str], retry: RetryPolicy) -> None:
    """Make the parent directories of the relative paths ``names`` under ``dest``, where the
    file system has directories (object stores need none)."""
    if not needs_directories(dest.filesystem):
        return
    parents = {dest.join(parent).path
               for parent in {rel.rpartition("/")[0] for rel in names} if parent} | {dest.path}

    def create(path: str) -> Callable[[], None]:
        return lambda: dest.filesystem.create_dir(path, recursive=True)

    for path in sorted(parents):
        storage_call(create(path), dest, retry, f"create directory {path!r} under")


def parent_path(path: str) -> str:
    """The ``/``-separated parent of ``path`` (``""`` at the top of a bucket)."""
    head, _, _ = path.rpartition("/")
    return head if head or not path.startswith("/") else "/"


def read_bytes(
    loc: StorageLocation, retry: RetryPolicy = DEFAULT_RETRY, *, limit: int = MAX_SMALL_FILE_BYTES
) -> bytes:
    """The whole content of the regular file at ``loc``, at most ``limit`` bytes.

    Bounded and typed (see :func:`~cairn._src.storage.reader.read_small_file`): a FIFO, a
    device or a directory raises :class:`ManifestError` without blocking, and so does a
    larger file, without being read.
    """
    return storage_call(lambda: read_small_file(loc, limit=limit), loc, retry, "read")


def write_bytes_atomic(
    loc: StorageLocation, data: bytes, retry: RetryPolicy = DEFAULT_RETRY, *,
    durable: bool = False,
) -> None:
    """Replace the file at ``loc`` with ``data`` so that readers never see a partial file.

    On file systems that rename atomically: write a temporary sibling, then rename it over
    ``loc``. Elsewhere: one single object write, which object stores make atomic.
    ``durable``: on storage with an OS path the temporary is also fsynced before the
    rename and the directory after it (:func:`~.durability.write_durably`), so the new
    content survives a crash of the machine once this returns.
    """
    fs = loc.filesystem
    os_path = local_os_path(loc) if durable else None
    if os_path is not None:
        storage_call(lambda: write_durably(os_path, data), loc, retry, "write")
        return
    atomic_rename = supports_atomic_rename(fs)

    def write() -> None:
        if needs_directories(fs):
            fs.create_dir(parent_path(loc.path), recursive=True)
        if not atomic_rename:
            with fs.open_output_stream(loc.path) as out:
                out.write(data)
            return
        temporary = f"{loc.path}{TEMPORARY_MARK}{uuid.uuid4().hex}"
        try:
            with fs.open_output_stream(temporary) as out:
                out.write(data)
            fs.move(temporary, loc.path)
        except BaseException:
            _remove_quietly(fs, temporary)
            raise

    storage_call(write, loc, retry, "write")


def _remove_quietly(fs: pafs.FileSystem, path: str) -> None:
    try:
        fs.delete_file(path)
    except OSError:
        pass  # Nothing was written, or cleanup failed too: the original error matters more.


def _file_info(loc: StorageLocation, retry: RetryPolicy) -> pafs.FileInfo:
    return storage_call(lambda: loc.filesystem.get_file_info(loc.path), loc, retry, "stat")


def file_type(loc: StorageLocation, retry: RetryPolicy = DEFAULT_RETRY) -> pafs.FileType:
    """``pyarrow.fs.FileType`` of ``loc``: ``File``, ``Directory`` or ``NotFound``."""
    return _file_info(loc, retry).type


def exists(loc: StorageLocation, retry: RetryPolicy = DEFAULT_RETRY) -> bool:
    """Whether a file or directory exists at ``loc``."""
    return bool(_file_info(loc, retry).type != pafs.FileType.NotFound)


def is_dir(loc: StorageLocation, retry: RetryPolicy = DEFAULT_RETRY) -> bool:
    """Whether ``loc`` is a directory (on object stores: a prefix with objects under it)."""
    return bool(_file_info(loc, retry).type == pafs.FileType.Directory)


def is_file(loc: StorageLocation, retry: RetryPolicy = DEFAULT_RETRY) -> bool:
    """Whether ``loc`` is a file."""
    return bool(_file_info(loc, retry).type == pafs.FileType.File)


def _select(loc: StorageLocation, recursive: bool, retry: RetryPolicy) -> list[pafs.FileInfo]:
    selector = pafs.FileSelector(loc.path, allow_not_found=True, recursive=recursive)

    def select() -> list[pafs.FileInfo]:
        try:
            infos: list[pafs.FileInfo] = loc.filesystem.get_file_info(selector)
            return infos
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            raise _listed_link_loop(loc.path) from exc

    try:
        return storage_call(select, loc, retry, "list")
    except CheckpointNotFoundError:
        # Some adapters ignore allow_not_found; a missing directory lists as empty, and so
        # does what is no directory (a file, a FIFO, a symbolic link loop).
        return []


def _listed_link_loop(path: str) -> NotADirectoryError:
    """What listing ``path`` that is (or lies behind) a symbolic link loop (``ELOOP``)
    raises: a loop in a directory's place holds no entries, as a file or a FIFO there
    does not. A run never writes one, and it is no outage to retry or report as one."""
    return NotADirectoryError(errno.ENOTDIR, "a symbolic link loop, not a directory", path)


def _relative(base: str, path: str) -> str:
    # Backends disagree on a leading '/' (fsspec's memory filesystem adds one), so compare
    # without it.
    base = base.strip("/")
    path = path.lstrip("/")
    if base and path.startswith(base + "/"):
        return path[len(base) + 1:]
    return path


def list_files(loc: StorageLocation, retry: RetryPolicy = DEFAULT_RETRY) -> dict[str, int]:
    """Every file under ``loc``, recursively: relative ``/``-path -> size. ``{}`` if missing.

    On local storage the walk never follows a symbolic link below ``loc`` (``a -> .``
    would make it endless, ``evil -> /outside`` would list what is not in the
    checkpoint): a link is listed as an entry of its own, at the size of the regular
    file it points to, or 0 when it points to a directory, and the bounded reader
    (:mod:`.reader`) refuses it when the files are read; a link that points nowhere is
    left out. An entry that is neither a file nor a directory (a FIFO, a socket, a
    device, or a link to one) raises :class:`StorageError`, as uploads refuse them:
    reading one could block or never end. A ``loc`` that is no directory (a file, a FIFO,
    a symbolic link loop) lists as empty. A path the store lists twice has the size a stat
    of that exact path gives, what the reader finds there (left out where that is no file).
    """
    root = local_os_path(loc)
    if root is not None:
        return _list_local(loc, root, retry)
    files: dict[str, int] = {}
    twice: set[str] = set()
    skipped: list[str] = []
    for info in _select(loc, True, retry):
        if info.type == pafs.FileType.File:
            relative = _relative(loc.path, info.path)
            if all(is_listed_name_safe(part) for part in relative.split("/")):
                if relative in files:
                    twice.add(relative)
                files[relative] = int(info.size or 0)
            else:
                skipped.append(relative)
    for relative in sorted(twice):
        # pyarrow's S3 lists the object 'x' and a "folder" object 'x/' that holds bytes
        # (anyone can write one) as two files 'x', in an order no one can rely on: the
        # last one listed would win. The reader opens 'x' after a stat of that exact path,
        # so that stat decides, and the sizes compared with a manifest are what it reads.
        found = _file_info(loc.join(relative), retry)
        if found.type == pafs.FileType.File:
            files[relative] = int(found.size or 0)
        else:
            del files[relative]
    _warn_skipped(skipped, loc)
    return files


def _list_local(loc: StorageLocation, root: str, retry: RetryPolicy) -> dict[str, int]:
    try:
        found = storage_call(lambda: _walk_local(root), loc, retry, "list")
    except CheckpointNotFoundError:
        return {}  # a missing directory (or a file) lists as empty
    files: dict[str, int] = {}
    skipped: list[str] = []
    for relative, size in found:
        if size is None:
            raise StorageError(
                f"{os.path.join(root, *relative.split('/'))!r} in {loc.display()} is not a "
                "regular file (a FIFO, socket or device, or a link to one); checkpoints may "
                "contain regular files and directories only."
            )
        if all(is_listed_name_safe(part) for part in relative.split("/")):
            files[relative] = size
        else:
            skipped.append(relative)
    _warn_skipped(skipped, loc)
    return files


def _walk_local(root: str) -> list[tuple[str, int | None]]:
    """``(relative path, size)`` of every file and link under the OS directory ``root``,
    links not followed; size None for a special file or a link to one. A directory below
    ``root`` that vanishes meanwhile holds nothing; ``root`` itself missing raises."""
    found: list[tuple[str, int | None]] = []
    stack = [("", root)]
    while stack:
        prefix, directory = stack.pop()
        try:
            try:
                with os.scandir(directory) as scan:
                    entries = list(scan)
            except OSError as exc:
                if exc.errno != errno.ELOOP:
                    raise
                raise _listed_link_loop(directory) from exc
        except (FileNotFoundError, NotADirectoryError):
            if not prefix:
                raise
            continue  # deleted (or replaced) since its parent was listed
        for entry in entries:
            relative = prefix + entry.name
            try:
                if entry.is_symlink():
                    info = os.stat(entry.path)  # what it points to, for its size only
                    if stat.S_ISDIR(info.st_mode):
                        found.append((relative, 0))
                        continue
                elif entry.is_dir(follow_symlinks=False):
                    stack.append((relative + "/", entry.path))
                    continue
                else:
                    info = entry.stat(follow_symlinks=False)
            except OSError as exc:
                if isinstance(exc, FileNotFoundError) or exc.errno == errno.ELOOP:
                    continue  # a link that points nowhere, or an entry deleted meanwhile
                raise
            found.append((relative, info.st_size if stat.S_ISREG(info.st_mode) else None))
    return found


def _warn_skipped(skipped: list[str], loc: StorageLocation) -> None:
    if skipped:
        shown = ", ".join(repr(name) for name in sorted(skipped)[:_SKIPPED_SHOWN])
        more = "" if len(skipped) <= _SKIPPED_SHOWN else ", ..."
        logger.warning("Skipped %d names under %s that are not safe path components: %s%s",
                       len(skipped), loc.display(), shown, more)


def is_listed_name_safe(name: str) -> bool:
    """Whether ``name``, as a listing gave it, is one path component that stays where it
    is: not empty, ``.`` or ``..``, and without ``/``, ``\\`` or NUL.

    Storage is untrusted input: anyone who can write a bucket can make it list ``..``
    under a run (an S3 key ``runs/run/../planted.txt``). Control characters are allowed:
    they are legal in names and cannot leave the directory (messages escape them).
    """
    return bool(name) and name not in (".", "..") and not any(
        ch in name for ch in _UNSAFE_NAME_CHARACTERS)


_UNSAFE_NAME_CHARACTERS = "/\\\x00"
# How many of the skipped names a warning quotes.
_SKIPPED_SHOWN = 5


def list_dir_names(loc: StorageLocation, retry: RetryPolicy = DEFAULT_RETRY) -> list[str]:
    """Sorted names of the immediate children (files and directories) of ``loc``.

    Names that are not safe single path components (:func:`is_listed_name_safe`) are
    left out, with one warning per call that counts them; so are names that are not UTF-8
    (a file another tool put beside a run: no name Cairn writes, and pyarrow cannot give
    it as text). A missing ``loc``, or one that is no directory (a file, a FIFO, a
    symbolic link loop), lists as empty.
    """
    names: list[str] = []
    skipped: list[str] = []
    for info in _select(loc, False, retry):
        try:
            name = info.base_name
        except UnicodeDecodeError:
            skipped.append("<a name that is not UTF-8>")
            continue
        (names if is_listed_name_safe(name) else skipped).append(name)
    _warn_skipped(skipped, loc)
    return sorted(names)


def is_local_link(loc: StorageLocation) -> bool:
    """Whether ``loc`` is a symbolic link on the local disk. A checkpoint directory that is
    one is never Cairn's: a run writes real directories, and what a planted link points at
    (the user's own copy of a checkpoint, say) is not the run's to adopt or delete."""
    path = local_os_path(loc)
    if path is None:
        return False
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:
        return False


def delete_dir(loc: StorageLocation, retry: RetryPolicy = DEFAULT_RETRY) -> None:
    """Delete the directory ``loc`` and everything under it; a missing directory is fine.

    On the local disk a name is one entry: a file or a symbolic link in the directory's
    place is removed itself, and a link is never followed. Elsewhere an object may have
    the directory's own name (the key ``run/checkpoint_000002`` beside the keys under
    ``run/checkpoint_000002/``): that object is not the directory's, and it stays; only
    what lies under the directory goes (:func:`_delete_under`).
    """
    fs = loc.filesystem
    local = local_os_path(loc) is not None

    def delete() -> None:
        info = fs.get_file_info(loc.path)
        if info.type == pafs.FileType.NotFound:
            return
        if info.type != pafs.FileType.File:
            fs.delete_dir(loc.path)
        elif local:
            fs.delete_file(loc.path)
        else:
            _delete_under(fs, loc.path)

    try:
        storage_call(delete, loc, retry, "delete")
    except CheckpointNotFoundError:
        pass  # Deleted concurrently, or by an earlier attempt whose reply was lost.


def _delete_under(fs: pafs.FileSystem, path: str) -> None:
    """Delete every file and directory below ``path`` on storage that also holds a file
    named ``path``, which stays: files first, then directories, the deepest first.

    The backend's own ``delete_dir`` cannot be used there: pyarrow's S3 refuses it for a
    path that is also an object, and a delete of ``path + "/"`` deletes that object. An
    empty directory marker ``path/`` may remain, which lists as nothing.
    """
    selector = pafs.FileSelector(path, allow_not_found=True, recursive=True)
    try:
        entries = fs.get_file_info(selector)
    except (FileNotFoundError, NotADirectoryError):
        return  # nothing below it (a custom store's answer for an object alone)
    below = path.strip("/") + "/"
    entries = [info for info in entries if info.path.lstrip("/").startswith(below)]
    files = [info.path for info in entries if info.type == pafs.FileType.File]
    directories = sorted((info.path for info in entries
                          if info.type == pafs.FileType.Directory),
                         key=lambda name: name.count("/"), reverse=True)
    for name in files:
        _delete_if_present(fs.delete_file, name)
    for name in directories:
        _delete_if_present(fs.delete_dir, name)


def _delete_if_present(delete: Callable[[str], None], path: str) -> None:
    try:
        delete(path)
    except FileNotFoundError:
        pass  # listed twice (an object and a marker of one name), or deleted meanwhile


def delete_file(loc: StorageLocation, retry: RetryPolicy = DEFAULT_RETRY, *,
                durable: bool = False) -> None:
    """Delete the file at ``loc``; a missing file is fine. ``durable``: on storage with an
    OS path its directory is fsynced afterwards, so the deletion survives a crash of the
    machine once this returns (and comes before whatever is deleted next)."""
    try:
        storage_call(lambda: loc.filesystem.delete_file(loc.path), loc, retry, "delete")
    except CheckpointNotFoundError:
        pass
    os_path = local_os_path(loc) if durable else None
    if os_path is not None and os.path.isdir(os.path.dirname(os_path)):
        storage_call(lambda: fsync_path(os.path.dirname(os_path)), loc, retry, "fsync")
