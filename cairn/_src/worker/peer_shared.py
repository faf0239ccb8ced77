"""The same-machine route of a peer transfer (``keep_survivors``): the surviving rank
writes a file straight into the receiving rank's directory instead of sending its bytes
over the socket, which on one machine costs two more copies of every byte and a hand-over
between the two processes every chunk.

The receiver (:func:`.peer_fetch.fetch_from_peer`) creates, for each file it asks for, an
empty file (``O_EXCL``, mode 0600, no link followed) in a directory of its own made for
the transfer inside the restore's (so no name of the checkpoint can be one of them), and
offers its path, device and inode in the request (:class:`Offers`). A peer that finds at
that path, before opening it, a regular file of that device and inode (never a FIFO or a
device), and then, on the descriptor, an empty file of its own user with mode 0600 and
one link, shares the file system: it serializes the file into it, hashing as it goes
(:func:`open_offered`). A peer on another machine, or in another container whose
``/dev/shm`` is its own, finds no such file and sends the bytes over the socket as
before. A peer never creates anything in the receiver's directory and never writes into
a file that holds data; it stops writing once the receiver removed the file (it gave
up), within :data:`CHECK_BYTES`.

The receiver trusts only its own reading of the file (mapped, not copied, from the
descriptor it created it with), against the manifest's size and checksum
(:meth:`Offers.take`); a file that does not match is removed. A peer that cannot finish
a file (``FAILED``) ends the transfer from that peer: what did not arrive comes from
storage.
"""

from __future__ import annotations

import mmap
import os
import stat
import tempfile
from collections.abc import Callable
from typing import Any

from cairn._src.storage.checksum import FileEntry, new_hasher

# The name of each offered file ends so.
SUFFIX = ".cairn-peer"
# The most files offered in one transfer (each holds a descriptor open meanwhile).
MAX_OFFERS = 256
# How many bytes a peer writes between two looks at whether the receiver still wants them.
CHECK_BYTES = 8 << 20

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_NOCTTY = getattr(os, "O_NOCTTY", 0)
_HASH_BYTES = 16 << 20

Wire = tuple[str, int, int]  # (path, st_dev, st_ino) of an offered file


class _Offer:
    def __init__(self, path: str, fd: int, info: os.stat_result) -> None:
        self.path = path
        self.fd = fd
        self.identity = (info.st_dev, info.st_ino)


class Offers:
    """The empty files offered for a peer to write into, one per wanted file, in a new
    directory under ``target`` (the receiving side; one thread). A name that cannot have
    one is streamed. :meth:`close` removes what was not taken."""

    def __init__(self, target: str, names: list[str]) -> None:
        # Each offer holds a descriptor open for the transfer: the first MAX_OFFERS names
        # (the caller puts the largest first) get one, the rest are streamed.
        names = names[:MAX_OFFERS]
        self._target = target
        self._offers: dict[str, _Offer] = {}
        self._directory: str | None = None
        try:
            self._directory = tempfile.mkdtemp(prefix=".cairn-peer-", dir=target)
        except OSError:
            return
        for number, rel in enumerate(names):
            path = os.path.join(self._directory, f"{number}{SUFFIX}")
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW
                             | _CLOEXEC, 0o600)
            except OSError:
                continue
            try:
                self._offers[rel] = _Offer(path, fd, os.fstat(fd))
            except OSError:
                os.close(fd)

    def wire(self) -> dict[str, Wire]:
        """What the request offers: each name's file."""
        return {rel: (offer.path, *offer.identity) for rel, offer in self._offers.items()}

    def __contains__(self, rel: object) -> bool:
        return rel in self._offers

    def size(self, rel: str) -> int:
        """How much the peer has written of ``rel`` so far."""
        return os.fstat(self._offers[rel].fd).st_size

    def take(self, rel: str, entry: FileEntry) -> int | None:
        """``rel`` as the peer wrote it, when its size and checksum are ``entry``'s: moved
        to its name under the target; its size. None (the file removed) otherwise."""
        offer = self._offers.pop(rel)
        try:
            if (os.fstat(offer.fd).st_size != entry.size
                    or _checksum(offer.fd, entry.size) != entry.checksum):
                return None
            final = os.path.join(self._target, *rel.split("/"))
            os.makedirs(os.path.dirname(final), exist_ok=True)
            os.replace(offer.path, final)
            offer.path = ""
            return entry.size
        finally:
            self._discard(offer)

    def close(self) -> None:
        """The transfer is over: every file not taken is removed, and the directory."""
        for offer in self._offers.values():
            self._discard(offer)
        self._offers.clear()
        if self._directory is not None:
            try:
                os.rmdir(self._directory)
            except OSError:
                pass
            self._directory = None

    @staticmethod
    def _discard(offer: _Offer) -> None:
        os.close(offer.fd)
        if not offer.path:
            return
        try:  # only the file offered, whatever else came to have its name
            found = os.lstat(offer.path)
            if (found.st_dev, found.st_ino) == offer.identity:
                os.unlink(offer.path)
        except OSError:
            pass


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


class OfferedFile:
    """An offered file, open for the peer's writes: raises :class:`OSError` once the
    receiver removed it, or is gone (``gone()`` true: its connection closed; a killed
    receiver removes nothing), looked at every :data:`CHECK_BYTES` written. A file the
    receiver no longer wants is truncated, so its pages go back to memory at once."""

    def __init__(self, fd: int, gone: Callable[[], bool] = lambda: False) -> None:
        self._file = os.fdopen(fd, "wb", buffering=0)
        self._gone = gone
        self._unchecked = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._unchecked += len(memoryview(data).cast("B"))
        if self._unchecked >= CHECK_BYTES:
            self._unchecked = 0
            if os.fstat(self._file.fileno()).st_nlink == 0 or self._gone():
                os.ftruncate(self._file.fileno(), 0)
                raise OSError("the receiving rank no longer wants the file")
        return int(self._file.write(data) or 0)

    def flush(self) -> None:
        pass

    def __enter__(self) -> OfferedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._file.close()


def open_offered(value: Any, gone: Callable[[], bool] = lambda: False,
                 ) -> OfferedFile | None:
    """The sending side: the file a peer's request offers (``value``, unchecked), open for
    writing, when it is the empty file offered (see the module docstring); ``gone``: see
    :class:`OfferedFile`. None (nothing opened) otherwise: another machine or file
    system, or not a file made for this."""
    if not (isinstance(value, tuple) and len(value) == 3 and isinstance(value[0], str)
            and value[0].endswith(SUFFIX) and all(type(v) is int for v in value[1:])):
        return None
    path, device, inode = value
    try:
        # Its type and identity before it is opened: a FIFO or device is never opened.
        found = os.lstat(path)
        if not stat.S_ISREG(found.st_mode) or (found.st_dev, found.st_ino) != (device, inode):
            return None
        fd = os.open(path, os.O_WRONLY | _NOFOLLOW | _NONBLOCK | _NOCTTY | _CLOEXEC)
    except (OSError, ValueError):  # ValueError: a NUL in the path
        return None
    try:
        info = os.fstat(fd)
    except OSError:
        os.close(fd)
        return None
    if not (stat.S_ISREG(info.st_mode) and (info.st_dev, info.st_ino) == (device, inode)
            and info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) == 0o600
            and info.st_size == 0 and info.st_nlink == 1):
        os.close(fd)
        return None
    return OfferedFile(fd, gone)
