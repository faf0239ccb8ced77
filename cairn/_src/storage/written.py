"""The entries of files already on storage: hashed where they lie, or taken from the
process that wrote them.

A checkpoint registered by reference (NO_UPLOAD, ``checkpoint_upload_fn``) is checksummed
by the controller before it commits, which reads every byte once more. A writer that
hashed the bytes as it wrote them (``cairn.torch.FileSystemWriter`` for
``torch.distributed.checkpoint``) hands its :class:`~.checksum.WrittenFile` records over
with the report instead. :func:`entries_of` takes such a record only for a regular file on
local storage, opened by the bounded, typed reader (no link anywhere in its path, not a
FIFO or a device), whose size, modification time and inode are still the ones recorded
when the writer closed it. Any other file, and every file on remote storage, is read and
hashed as before. A file changed afterwards in place, keeping its size and time (which
takes a deliberate ``os.utime``), fails the checksum when it is restored, as a file
changed after its commit does.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from cairn._src.errors import CheckpointDamagedError
from cairn._src.storage.checksum import FileEntry, WrittenFile
from cairn._src.storage.location import StorageLocation
from cairn._src.storage.paths import check_relative_path
from cairn._src.storage.reader import local_os_path, open_regular_file
from cairn._src.storage.retry import RetryPolicy
from cairn._src.storage.transfer import compute_entries

__all__ = ["entries_of"]


def entries_of(loc: StorageLocation, files: Iterable[str], written: Mapping[str, WrittenFile],
               *, retry: RetryPolicy) -> dict[str, FileEntry]:
    """``relpath -> FileEntry`` for ``files`` under ``loc``: a :class:`WrittenFile` of
    ``written`` where the file on storage is still the one it describes (see the module
    docstring), the file read and hashed by
    :func:`~cairn._src.storage.transfer.compute_entries` otherwise (which refuses links
    and files that are not regular in its own words)."""
    names = sorted({check_relative_path(rel, argument="files") for rel in files})
    taken: dict[str, FileEntry] = {}
    if local_os_path(loc) is not None:
        for rel in names:
            record = written.get(rel)
            if isinstance(record, WrittenFile) and _unchanged(loc, rel, record):
                taken[rel] = record.entry
    hashed = compute_entries(loc, [rel for rel in names if rel not in taken], retry=retry)
    return {rel: taken[rel] if rel in taken else hashed[rel] for rel in names}


def _unchanged(loc: StorageLocation, rel: str, record: WrittenFile) -> bool:
    try:
        with open_regular_file(loc, rel, expected_size=record.entry.size) as opened:
            found = os.fstat(opened.stream.fileno())
    except (OSError, CheckpointDamagedError):
        return False  # hashed instead, and refused there in its own words if it must be
    return (found.st_mtime_ns, found.st_ino) == (record.mtime_ns, record.inode)
