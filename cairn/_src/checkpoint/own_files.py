"""Cairn's own files in a directory that also holds what is not Cairn's.

Two directories hold both, and there Cairn deletes only files it wrote, named exactly as
it names them:

* the run directory: beside the index, the lease and the checkpoints, the user's own
  entries (logs, a reference's data) and, after a crash, the temporary file of an atomic
  write (:func:`is_torn_write`); so do the logs' directories (``events/``, ``metrics/``),
  whose segments are written the same way (:func:`is_log_entry`);
* the directory of a checkpoint committed by reference whose data lies inside it (a
  ``checkpoint_upload_fn`` that wrote ``build_checkpoint_path_from_name(name) + "/dcp"``
  and returned that): when retention forgets it, only the manifest and Cairn's own files
  go (:func:`forget_checkpoint_dir`), and the directory itself once nothing else is left.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Collection

import pyarrow.fs as pafs

from cairn._src.errors import CairnError
from cairn._src.run.layout import INDEX_NAME, LEASE_NAME, MANIFEST_NAME
from cairn._src.run.segment_log import is_claim_name, is_segment_name
from cairn._src.run.storage_check import MARKER_NAME
from cairn._src.storage.fileio import (
    TEMPORARY_MARK,
    delete_dir,
    delete_file,
    file_type,
    is_local_link,
    list_dir_names,
    list_files,
)
from cairn._src.storage.location import StorageLocation
from cairn._src.storage.reader import local_os_path
from cairn._src.storage.retry import RetryPolicy

logger = logging.getLogger(__name__)

# The name of an atomic write's temporary file: the final name, the mark, and the 32
# lowercase hex digits of a uuid4 (fileio.write_bytes_atomic, durability.write_durably).
_TORN_WRITE = re.compile(rf"(?P<final>.+){re.escape(TEMPORARY_MARK)}[0-9a-f]{{32}}")
# What Cairn writes atomically into the run directory itself: the index, the lease and
# the storage check's marker (manifests go into checkpoint directories, log segments
# into metrics/ and events/).
RUN_FILES = frozenset({INDEX_NAME, LEASE_NAME, MARKER_NAME})


def is_log_entry(name: str) -> bool:
    """Whether Cairn writes ``name`` atomically into a log's directory (events/, metrics/):
    a segment, segment_NNNNNN.jsonl, or a writer's claim of a segment number
    (run/segment_log.py)."""
    return is_segment_name(name) or is_claim_name(name)


# The finals a torn write may be of: a set of names, or a test of a name.
Finals = Collection[str] | Callable[[str], bool]
# How many names one warning lists.
_SHOWN = 10


def is_torn_write(name: str, finals: Finals) -> bool:
    """Whether ``name`` is the temporary name an atomic write of one of ``finals`` uses."""
    match = _TORN_WRITE.fullmatch(name)
    if match is None:
        return False
    final = match.group("final")
    return finals(final) if callable(finals) else final in finals


def is_plain_file(location: StorageLocation, retry: RetryPolicy) -> bool:
    """Whether ``location`` is a regular file: not a directory, not a symbolic link (Cairn
    never writes one, so one is not Cairn's), not a FIFO or device."""
    return (not is_local_link(location)
            and file_type(location, retry) == pafs.FileType.File)


def delete_torn_writes(directory: StorageLocation, names: Collection[str],
                       finals: Finals, retry: RetryPolicy) -> list[str]:
    """Delete those of ``names`` (entries of ``directory`` named with the temporary mark)
    that are torn atomic writes of ``finals``: regular files under exactly the name such a
    write uses. The names left in place, for the caller's warning."""
    left = []
    for name in sorted(names):
        location = directory.join(name)
        try:
            if is_torn_write(name, finals) and is_plain_file(location, retry):
                delete_file(location, retry)
                continue
        except CairnError as exc:
            # Replaced by a directory meanwhile, or an outage: a leftover costs nothing.
            logger.debug("Could not delete %s: %s", location.display(), exc)
        left.append(name)
    return left


def warn_left(directory: StorageLocation, left: Collection[str],
              finals: str = f"<one of {sorted(RUN_FILES)}>") -> None:
    """One warning naming the entries with the temporary mark left in ``directory``
    (``finals``: the names whose torn writes Cairn deletes there, in words)."""
    if not left:
        return
    shown = sorted(left)[:_SHOWN]
    more = f" (and {len(left) - _SHOWN} more)" if len(left) > _SHOWN else ""
    logger.warning(
        "Leaving %s%s in %s in place: named with Cairn's temporary-file mark %r, but not "
        "a temporary file Cairn's atomic writes leave there (a regular file named "
        "%s%s<32 hex digits>); remove it yourself if it is not needed.",
        shown, more, directory.display(), TEMPORARY_MARK, finals, TEMPORARY_MARK)


def forget_checkpoint_dir(checkpoint_dir: StorageLocation, retry: RetryPolicy) -> bool:
    """Delete what Cairn wrote into ``checkpoint_dir`` besides its manifest (deleted by
    the caller first: torn writes of it), and the directory itself when nothing else is
    left in it; whether it was. For a checkpoint whose reference's data lies inside its
    own directory: that data, and whatever else the user put there, stays."""
    marked = [n for n in list_dir_names(checkpoint_dir, retry) if TEMPORARY_MARK in n]
    delete_torn_writes(checkpoint_dir, marked, {MANIFEST_NAME}, retry)
    os_path = local_os_path(checkpoint_dir)
    if os_path is not None:
        # Removed only if empty, whatever a listing would leave out.
        try:
            os.rmdir(os_path)
        except FileNotFoundError:
            pass
        except OSError:
            return False
        return True
    if list_files(checkpoint_dir, retry):
        return False
    delete_dir(checkpoint_dir, retry)
    return True
