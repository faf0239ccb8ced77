"""The same-machine route of a peer transfer (``keep_survivors``): the surviving rank
writes a file straight into the receiving rank's directory instead of sending its bytes
over the socket, which on one machine costs two more copies of every byte and a hand-over
between the two processes every chunk.

The receiver (:func:`.peer_fetch.fetch_from_peer`) creates each file it asks for, empty,
under a temporary name (``O_EXCL``, mode 0600, no link followed) and offers its path,
device and inode in the request (:class:`Offer`). A peer that can open that path without
following a link, and finds there an empty regular file of its own user with one link
and the same device and inode, shares the file system: it serializes the file into it,
hashing as it goes (:func:`write_offered`). A peer on another machine, or in another
container whose ``/dev/shm`` is its own, finds no such file and sends the bytes over the
socket as before. A peer never creates anything in the receiver's directory and never
writes into a file that holds data: a receiver that gave up and removed its files leaves
it nothing to write into.

The receiver trusts only its own reading of the file (mapped, not copied, from the
descriptor it created it with), against the manifest's size and checksum
(:meth:`Offer.take`); a file that does not match is removed.
"""

from __future__ import annotations

import mmap
import os
import stat
from typing import Any, BinaryIO

from cairn._src.storage.checksum import FileEntry, new_hasher

# The name a file has while a peer writes it, until its checksum is known to be the
# manifest's.
SUFFIX = ".cairn-peer"

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_HASH_BYTES = 16 << 20

Wire = tuple[str, int, int]  # (path, st_dev, st_ino) of an offered file


class Offer:
    """One empty file created for a peer to write ``rel`` into (the receiving side; one
    thread). :meth:`take` or :meth:`discard` ends it."""

    def __init__(self, target: str, rel: str) -> None:
        self.final = os.path.join(target, *rel.split("/"))
        os.makedirs(os.path.dirname(self.final), exist_ok=True)
        self.path = self.final + SUFFIX
        self._fd: int | None = os.open(
            self.path, os.O_RDONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, 0o600)
        info = os.fstat(self._fd)
        self.wire: Wire = (self.path, info.st_dev, info.st_ino)

    def size(self) -> int:
        """How much the peer has written so far."""
        assert self._fd is not None
        return os.fstat(self._fd).st_size

    def take(self, entry: FileEntry) -> int | None:
        """The file as the peer wrote it, when its size and checksum are ``entry``'s:
        moved to its final name; its size. None (the file removed) otherwise."""
        assert self._fd is not None
        try:
            if self.size() != entry.size or _checksum(self._fd, entry.size) != entry.checksum:
                return None
            os.replace(self.path, self.final)
            self.path = ""
            return entry.size
        finally:
            self.discard()

    def discard(self) -> None:
        """Not used (any more): closed, and removed unless taken."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self.path:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            self.path = ""


def _checksum(fd: int, size: int) -> str:
    hasher = new_hasher()
    if size:
        with mmap.mmap(fd, size, prot=mmap.PROT_READ) as mapped:
            view = memoryview(mapped)
            try:
                for start in range(0, size, _HASH_BYTES):
                    hasher.update(view[start:start + _HASH_BYTES])
            finally:
                view.release()
    return str(hasher.hexdigest())


def offer_files(target: str, names: list[str]) -> dict[str, Offer]:
    """An :class:`Offer` under ``target`` for each of ``names`` that can have one (a name
    already taken there is sent over the socket instead)."""
    offers: dict[str, Offer] = {}
    for rel in names:
        try:
            offers[rel] = Offer(target, rel)
        except OSError:
            continue
    return offers


def open_offered(value: Any) -> BinaryIO | None:
    """The sending side: the file a peer's request offers (``value``, unchecked), open for
    writing, when it is the empty file offered: this user's, one link, the same device and
    inode. None (nothing opened) otherwise: another machine or file system, or not a file
    the receiver made for this."""
    if not (isinstance(value, tuple) and len(value) == 3 and isinstance(value[0], str)
            and all(type(v) is int for v in value[1:])):
        return None
    path, device, inode = value
    try:
        # Its type and identity before it is opened: a FIFO or device is never opened.
        found = os.lstat(path)
        if not stat.S_ISREG(found.st_mode) or (found.st_dev, found.st_ino) != (device, inode):
            return None
        fd = os.open(path, os.O_WRONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC)
    except (OSError, ValueError):  # ValueError: a NUL in the path
        return None
    try:
        info = os.fstat(fd)
    except OSError:
        os.close(fd)
        return None
    if not (stat.S_ISREG(info.st_mode) and (info.st_dev, info.st_ino) == (device, inode)
            and info.st_uid == os.geteuid() and info.st_size == 0 and info.st_nlink == 1):
        os.close(fd)
        return None
    return os.fdopen(fd, "wb", buffering=0)
