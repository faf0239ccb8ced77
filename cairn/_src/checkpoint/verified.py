"""Which local checkpoints this process has verified, so that each is verified once.

``Checkpoint.as_directory()`` on local storage hands out the checkpoint's own directory
(no copy), after checking every file against the manifest. Reading all the data on every
call would make a loop over ``as_directory()`` cost a full read each time, so a verified
checkpoint is remembered, keyed by where its manifest and data are and by a hash of the
manifest's bytes (a rewritten manifest is a new checkpoint to verify). With it goes a
signature of the data files as ``lstat`` saw them before the verification (size,
modification time, inode, type): a later call re-verifies when any file changed since,
which costs one ``lstat`` per file when nothing did.

This trades a full re-read for metadata checks: a change that keeps a file's size,
modification time and inode (``os.utime`` after writing, or damage below the file system)
is caught by ``verify()``, ``cairn verify`` and every restore, not here.

Thread-safe: any number of threads may call :func:`verify_local_once` at once; two
first calls for the same checkpoint may both verify it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

from cairn._src.storage.checksum import new_hasher

logger = logging.getLogger(__name__)

# How many verified checkpoints a process remembers (oldest forgotten first).
_MAX_REMEMBERED = 4096

Signature = tuple[tuple[int, int, int, int] | None, ...]
_Key = tuple[str, str, str]


class VerifiedCache:
    """A bounded, thread-safe memory of verified checkpoints and their file signatures."""

    def __init__(self, limit: int = _MAX_REMEMBERED) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._entries: OrderedDict[_Key, Signature] = OrderedDict()

    def get(self, key: _Key) -> Signature | None:
        with self._lock:
            signature = self._entries.get(key)
            if signature is not None:
                self._entries.move_to_end(key)
            return signature

    def put(self, key: _Key, signature: Signature) -> None:
        with self._lock:
            self._entries[key] = signature
            self._entries.move_to_end(key)
            while len(self._entries) > self._limit:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


VERIFIED = VerifiedCache()


def file_signature(root: str, names: Iterable[str]) -> Signature:
    """``(size, mtime_ns, inode, mode)`` of each file as ``lstat`` sees it (None: missing)."""
    signature: list[tuple[int, int, int, int] | None] = []
    for rel in names:
        try:
            info = os.lstat(os.path.join(root, *rel.split("/")))
        except OSError:
            signature.append(None)
            continue
        signature.append((info.st_size, info.st_mtime_ns, info.st_ino, info.st_mode))
    return tuple(signature)


def verify_local_once(
    *,
    manifest_where: str,
    manifest_bytes: bytes,
    data_root: str,
    names: list[str],
    verify: Callable[[], None],
) -> bool:
    """Run ``verify()`` unless this process already verified the same checkpoint unchanged.

    ``names`` are the manifest's files in a fixed order, ``data_root`` the OS path of the
    data. Returns True when ``verify`` ran. A checkpoint that fails ``verify`` (which
    raises) is not remembered, so the next call checks it again.
    """
    digest = new_hasher()
    digest.update(manifest_bytes)
    key = (manifest_where, data_root, digest.hexdigest())
    signature = file_signature(data_root, names)
    if VERIFIED.get(key) == signature and None not in signature:
        return False
    started = time.perf_counter()
    verify()
    VERIFIED.put(key, signature)
    logger.debug("Verified %d files of %s in %.3fs", len(names), data_root,
                 time.perf_counter() - started)
    return True
