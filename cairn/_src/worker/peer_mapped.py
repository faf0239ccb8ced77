"""The same-machine route of a peer transfer for a snapshot held in shared memory
(``keep_survivors``; :mod:`.shared_state`): a replacement rank uses the surviving rank's
copy in place, verified, instead of having it serialized into new memory.

The receiver asks first for this route (:data:`MAPPED` in its request). A peer whose
copy of a file lies in an arena answers with the arena (where to open it) and, per
file, the skeleton and its tensors' places; a peer without one answers with nothing
and the receiver asks again the usual way (:func:`.peer_fetch.fetch_from_peer`). The
receiver opens and maps the arena itself (:func:`.shared_state.open_arena`: its own
user's regular file, of the device and inode named) and keeps a file's state only when
it serializes again to the manifest's size and checksum.

The connection is the peer's lease: it holds its copy (never freed nor written again)
until the receiver closes it, which it does once nothing refers to the mapping any more
(its last tensor gone: a finalizer on the mapping), or at once when nothing was used.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
import weakref
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection
from typing import Any

from cairn._src.storage.checksum import FileEntry
from cairn._src.wire.sockets import set_io_timeout
from cairn._src.worker.direct_write import HashingSink
from cairn._src.worker.peer_fetch import Outcome, connect_peer, receive_object
from cairn._src.worker.shared_state import open_arena, rebuild, serialize

logger = logging.getLogger(__name__)

# The request's fourth element that asks for this route.
MAPPED = "mapped"


def answer_mapped(connection: Connection, writer: Any, names: tuple[str, ...]) -> None:
    """The peer server's side: describe ``names`` of ``writer`` (a held snapshot) as it
    lies in shared memory, then hold the copy until the receiver closes the connection
    (the caller releases it after). Nothing to describe: an empty answer."""
    describe: Any = getattr(writer, "describe_shared", None)
    described: dict[str, tuple[bytes, list[Any]]] = {}
    wire = None
    for rel in names if callable(describe) else ():
        found = describe(rel)
        if found is not None and wire in (None, found[0]):
            wire = found[0]
            described[rel] = (found[1], found[2])
    if not described:
        connection.send(())
        return
    connection.send((wire, described))
    set_io_timeout(connection, 0)  # the lease lasts as long as the receiver uses it
    try:
        connection.recv_bytes(16)  # its release (a forked child may hold the socket on)
    except (EOFError, OSError):
        pass


def fetch_mapped(authkey: bytes, peer_rank: int, address: tuple[str, int],
                 report_index: int, files: dict[str, FileEntry], wanted: set[str],
                 outcome: Outcome, stop: threading.Event | None = None) -> dict[str, Any]:
    """The receiver's side: the states of ``wanted`` (of report ``report_index``) that
    ``peer_rank`` holds in shared memory this process can map, each verified against
    ``files``; nothing when the peer is elsewhere or holds none. What did not match goes
    to ``outcome``'s reasons; what did to its peer bytes."""
    try:
        connection = connect_peer(address, authkey)
    except (OSError, EOFError, AuthenticationError):
        return {}  # the usual route says why
    used: dict[str, Any] = {}
    try:
        connection.send((report_index, sorted(wanted), {}, MAPPED))
        answer = receive_object(connection, stop)
        if not (isinstance(answer, tuple) and len(answer) == 2
                and isinstance(answer[1], dict)):
            return used
        limit = 4 * sum(entry.size for entry in files.values()) + (1 << 30)
        mapping = open_arena(answer[0], limit)
        if mapping is None:
            return used
        # The lease ends with the mapping's last user (or below, when nothing is used).
        weakref.finalize(mapping, _release, connection, os.getpid())
        for rel, described in answer[1].items():
            if rel not in wanted or not (isinstance(described, tuple) and len(described) == 2
                                         and isinstance(described[0], bytes)):
                continue
            try:
                value = rebuild(described[0], described[1], mapping)
                sink = HashingSink(None)
                serialize(value, sink)
                if sink.entry() != files[rel]:
                    outcome.reasons.append(f"peer rank {peer_rank}'s shared memory copy "
                                           f"of {rel!r} does not match the manifest's "
                                           "checksum")
                    continue
            except Exception as exc:  # a description that does not fit: not used
                outcome.reasons.append(f"peer rank {peer_rank}'s shared memory copy of "
                                       f"{rel!r} was not used: {type(exc).__name__}: "
                                       f"{str(exc)[:200]}")
                continue
            used[rel] = value
            outcome.from_peers[rel] = (peer_rank, files[rel].size)
        return used
    except Exception as exc:  # whatever a peer sends, the usual route takes over
        logger.debug("Peer rank %d's shared copy was not used: %s", peer_rank, exc)
        return used
    finally:
        if not used:
            _release(connection)


def private_view(writer: Any, rel: str) -> Any:
    """File ``rel`` of this process's own held snapshot ``writer`` over a private mapping
    of its arena (what is written to it stays in this view; a deep copy where no mapping
    can be made); None when it does not lie in one. The caller verifies it as any other
    copy."""
    describe: Any = getattr(writer, "describe_shared", None)
    found = describe(rel) if callable(describe) else None
    if found is None:
        return None
    mapping = open_arena(found[0], found[0][4])
    try:
        if mapping is not None:
            return rebuild(found[1], found[2], mapping)
    except Exception as exc:  # (its own description: not expected)
        logger.debug("No private view of %r: %s", rel, exc)
    return copy.deepcopy(writer.value(rel))  # (no mapping to be had: a private copy)


def _release(connection: Connection, owner: int | None = None) -> None:
    """End a lease: say so (a forked child holding the socket keeps it open), close. In a
    process forked from ``owner`` (its copy of the finalizer), only close."""
    if owner is None or owner == os.getpid():
        try:
            connection.send_bytes(b"done")
        except (OSError, ValueError):
            pass
    connection.close()
