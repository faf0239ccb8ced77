"""Restore directories in a RAM file system, and the ones a killed process left there.

A kept or replaced rank restores its checkpoint into ``/dev/shm`` when it has room
(``cairn._src.worker.memory_copy``). Such a directory is memory: a worker killed with
``kill -9`` in the middle of a restore can never remove it, and a gigabyte of RAM would stay
taken until the machine restarts. So each one is named after its process,
``cairn-checkpoint-<pid namespace>-<pid>-<random>``, and :func:`sweep_stale` (run when a
process first restores there, and by the local backend once a run's workers are gone)
removes those of processes that no longer run. A deferred report's private directory (a
snapshot written to local files before its upload: ``worker/upload_job.py``) in the
temporary directory is named the same way, and swept there.

What may be removed, and nothing else: a directory (never a link, a file or anything else
under that name) directly in the RAM file system, owned by this user, whose name carries
this process's PID namespace (a PID of another namespace, as in a container sharing the
mount, says nothing here) and the PID of a process that does not exist. Anything that
cannot be checked is left alone.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shutil
import stat
import tempfile

from cairn._src.processes import process_exists

logger = logging.getLogger(__name__)

PREFIX = "cairn-checkpoint-"
# A RAM file system: a restore from memory is written there when it fits.
SHARED_MEMORY = "/dev/shm"


def _namespace() -> str:
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return "0"


def make_directory(base: str | None) -> str:
    """A new private directory under ``base`` (None: the temporary directory) named after
    this process (see the module docstring)."""
    return tempfile.mkdtemp(prefix=f"{PREFIX}{_namespace()}-{os.getpid()}-", dir=base)


def new_path() -> str:
    """A path in the temporary directory named after this process, as
    :func:`make_directory` names one, not created yet (its creator makes it private)."""
    return os.path.join(tempfile.gettempdir(),
                        f"{PREFIX}{_namespace()}-{os.getpid()}-{secrets.token_hex(16)}")


def sweep_stale(base: str) -> list[str]:
    """Remove the restore directories under ``base`` that processes no longer running
    left (see the module docstring); the names removed."""
    pattern = re.compile(rf"{re.escape(PREFIX)}{re.escape(_namespace())}-(\d+)-")
    removed: list[str] = []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return removed
    for entry in entries:
        match = pattern.match(entry.name)
        if match is None or int(match.group(1)) == os.getpid():
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            continue
        if process_exists(int(match.group(1))):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(entry.name)
    if removed:
        logger.info("Removed %d restore director%s left in %s by processes that are gone",
                    len(removed), "y" if len(removed) == 1 else "ies", base)
    return removed
