"""The xyz store's own client: named binary objects in one SQLite database file.

This module stands in for the SDK of a proprietary object store and knows nothing about
Cairn (standard library only); :mod:`xyzstorage.cairn_plugin` adapts it to Cairn.

Addresses are URIs ``xyz://<bucket>/<key...>?db=/abs/path/store.db``: the object key is
everything after ``xyz://`` and before ``?`` (``bucket/a/b``), the database is the ``db``
query parameter or, when the URI has none, the ``XYZ_STORE_DB`` environment variable.

Guarantees (see :class:`Client`):

* ``put`` is atomic: a reader sees the old object or the whole new one, never a part, also
  when the writing process is killed mid-write (SQLite transactions);
* ``open`` streams one consistent version: overwriting or deleting the object while it is
  being read does not change what the reader gets (a read transaction on a WAL database);
* thread-safe (one SQLite connection per thread, one writer at a time per process) and
  process-safe (SQLite's file locks; readers never block writers in WAL mode). The
  database must be on a local disk: SQLite's locks do not work over NFS.
"""

from __future__ import annotations

import contextlib
import io
import os
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any, BinaryIO

SCHEME = "xyz"
DB_ENV_VAR = "XYZ_STORE_DB"
DEFAULT_CHUNK_SIZE = 1 << 20
DEFAULT_BUSY_TIMEOUT_S = 60.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS objects (
    blob_id    INTEGER PRIMARY KEY AUTOINCREMENT,
    key        TEXT NOT NULL UNIQUE,
    size       INTEGER NOT NULL,
    chunk_size INTEGER NOT NULL,
    modified   REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS chunks (
    blob_id INTEGER NOT NULL,
    seq     INTEGER NOT NULL,
    data    BLOB NOT NULL,
    PRIMARY KEY (blob_id, seq)
);
"""


class XyzError(Exception):
    """Root of the client's errors."""


class ObjectNotFound(XyzError):
    """There is no object with this key."""

    def __init__(self, key: str) -> None:
        super().__init__(f"no object {key!r}")
        self.key = key

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key,))


class StoreBusy(XyzError):
    """The database stayed locked by other writers for longer than the busy timeout.

    A retry may succeed.
    """


def parse_uri(uri: str) -> tuple[str, str]:
    """``(database path, object key)`` of an ``xyz://`` URI.

    ``xyz://bucket/a/b?db=/data/store.db`` -> ``("/data/store.db", "bucket/a/b")``. Raises
    ``ValueError`` for another scheme, an unknown query parameter, or no database (neither
    ``db=`` nor ``$XYZ_STORE_DB``) or a relative one.
    """
    prefix = f"{SCHEME}://"
    if not isinstance(uri, str) or not uri.lower().startswith(prefix):
        raise ValueError(f"uri={uri!r} is not an {prefix} URI ({prefix}<bucket>/<key>?db=...)")
    rest = uri[len(prefix):]
    path, _, query = rest.partition("?")
    params = urllib.parse.parse_qs(query, keep_blank_values=True)
    unknown = sorted(set(params) - {"db"})
    if unknown:
        raise ValueError(f"uri={uri!r} has unknown query parameters {unknown}; accepted: ['db']")
    db = params["db"][-1] if "db" in params else os.environ.get(DB_ENV_VAR, "")
    if not db:
        raise ValueError(
            f"uri={uri!r} names no database: add '?db=/abs/path/store.db' to the URI or set "
            f"the {DB_ENV_VAR} environment variable."
        )
    db = os.path.expanduser(db)
    if not os.path.isabs(db):
        raise ValueError(
            f"The database {db!r} of uri={uri!r} must be an absolute path, so that every "
            "process (whatever its working directory) opens the same file."
        )
    return os.path.normpath(db), path.strip("/")


_clients: dict[str, Client] = {}
_clients_lock = threading.Lock()


def connect(uri_or_db: str) -> Client:
    """The client of the database an ``xyz://`` URI (or an absolute path) names.

    One client per database file per process, so that all its users share the
    connections and the write lock.
    """
    if uri_or_db.lower().startswith(f"{SCHEME}://"):
        db, _ = parse_uri(uri_or_db)
    else:
        db = os.path.normpath(os.path.abspath(os.path.expanduser(uri_or_db)))
    with _clients_lock:
        client = _clients.get(db)
        if client is None:
            client = _clients[db] = Client(db)
        return client


@contextlib.contextmanager
def _sqlite_errors(what: str) -> Iterator[None]:
    try:
        yield
    except sqlite3.OperationalError as exc:
        text = str(exc).lower()
        if "locked" in text or "busy" in text:
            raise StoreBusy(f"{what}: the database is busy ({exc})") from exc
        raise XyzError(f"{what}: {exc}") from exc
    except sqlite3.Error as exc:
        raise XyzError(f"{what}: {exc}") from exc


def _read_exactly(stream: Any, size: int) -> bytes:
    """Up to ``size`` bytes; fewer only at the end of ``stream`` (raw streams read short)."""
    parts: list[bytes] = []
    wanted = size
    while wanted > 0:
        part = stream.read(wanted)
        if not part:
            break
        parts.append(bytes(part))
        wanted -= len(part)
    return b"".join(parts)


class Client:
    """Objects in the SQLite database ``db_path`` (created on first use, in WAL mode).

    Thread-safe and process-safe (module docstring). Objects are stored in chunks of
    ``chunk_size`` bytes, so objects of any size stream in bounded memory. Writers in one
    process take turns on a lock; writers in different processes wait for SQLite's lock
    up to ``busy_timeout_s``, then get :class:`StoreBusy`. Pickles as its settings.
    """

    def __init__(
        self,
        db_path: str,
        *,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
    ) -> None:
        if not os.path.isabs(db_path):
            raise ValueError(f"db_path={db_path!r} must be an absolute path")
        if not isinstance(chunk_size, int) or chunk_size <= 0:
            raise ValueError(f"chunk_size={chunk_size!r} must be a positive int")
        self.db_path = db_path
        self.chunk_size = chunk_size
        self.busy_timeout_s = busy_timeout_s
        self._local = threading.local()
        self._write_lock = threading.Lock()
        self._schema_lock = threading.Lock()
        self._schema_ready = False

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore_client, (self.db_path, self.chunk_size, self.busy_timeout_s))

    def __repr__(self) -> str:
        return f"xyzstorage.Client({self.db_path!r})"

    # --- connections -----------------------------------------------------------------------

    def _open_connection(self) -> sqlite3.Connection:
        # Autocommit mode: transactions are explicit (BEGIN IMMEDIATE for writes).
        conn = sqlite3.connect(
            self.db_path, timeout=self.busy_timeout_s, isolation_level=None,
            check_same_thread=False,
        )
        # FULL: a committed object survives a power loss, as on a real object store.
        conn.execute("PRAGMA synchronous=FULL")
        return conn

    def _ensure_schema(self, conn: sqlite3.Connection) -> None:
        with self._schema_lock:
            if self._schema_ready:
                return
            deadline = time.monotonic() + self.busy_timeout_s
            while True:
                try:
                    # Switching to WAL needs a moment alone with the file; another process
                    # creating the database at the same time makes it fail with 'locked'
                    # without waiting, hence the loop.
                    conn.execute("PRAGMA journal_mode=WAL")
                    conn.executescript(_SCHEMA)
                    break
                except sqlite3.OperationalError as exc:
                    if "locked" not in str(exc) or time.monotonic() > deadline:
                        raise
                    time.sleep(0.01)
            self._schema_ready = True

    def _conn(self) -> sqlite3.Connection:
        """This thread's connection (a forked child opens its own)."""
        local = self._local
        if getattr(local, "conn", None) is None or local.pid != os.getpid():
            directory = os.path.dirname(self.db_path)
            os.makedirs(directory, exist_ok=True)
            with _sqlite_errors(f"open {self.db_path}"):
                fresh = self._open_connection()
                try:
                    self._ensure_schema(fresh)
                except BaseException:
                    fresh.close()
                    raise
            local.conn, local.pid = fresh, os.getpid()
        conn: sqlite3.Connection = local.conn
        return conn

    @contextlib.contextmanager
    def _writing(self, what: str) -> Iterator[sqlite3.Connection]:
        conn = self._conn()
        with self._write_lock, _sqlite_errors(what):
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise

    def close(self) -> None:
        """Close this thread's connection (others close when their thread ends)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    # --- objects ---------------------------------------------------------------------------

    def put(self, key: str, data: bytes | bytearray | memoryview | BinaryIO) -> int:
        """Store ``data`` (bytes, or a binary stream read to its end) as ``key``; its size.

        Atomic, and replaces any object ``key``. Holds the write lock while it reads
        ``data``: pass data that is ready (bytes, a local file), not a slow network stream.
        """
        stream: Any = io.BytesIO(data) if isinstance(data, (bytes, bytearray, memoryview)) else data
        with self._writing(f"put {key!r}") as conn:
            self._delete_in(conn, key)
            blob_id = conn.execute(
                "INSERT INTO objects (key, size, chunk_size, modified) VALUES (?, 0, ?, ?)",
                (key, self.chunk_size, time.time()),
            ).lastrowid
            size = seq = 0
            while chunk := _read_exactly(stream, self.chunk_size):
                conn.execute("INSERT INTO chunks (blob_id, seq, data) VALUES (?, ?, ?)",
                             (blob_id, seq, chunk))
                size += len(chunk)
                seq += 1
            conn.execute("UPDATE objects SET size = ? WHERE blob_id = ?", (size, blob_id))
        return size

    def get(self, key: str) -> bytes:
        """The whole object; :class:`ObjectNotFound` when missing."""
        with self.open(key) as stream:
            return stream.read()

    def open(self, key: str) -> BinaryIO:
        """A seekable stream of the object as it is now; :class:`ObjectNotFound` if missing.

        The stream holds its own connection and read transaction until it is closed.
        """
        conn = self._conn()  # creates the database and schema if needed
        del conn
        return _ObjectReader(self, key)  # type: ignore[return-value]

    def size(self, key: str) -> int | None:
        """The object's size in bytes, or ``None`` when there is no object ``key``."""
        with _sqlite_errors(f"size {key!r}"):
            row = self._conn().execute(
                "SELECT size FROM objects WHERE key = ?", (key,)).fetchone()
        return None if row is None else int(row[0])

    def scan(self, prefix: str = "") -> list[tuple[str, int]]:
        """``(key, size)`` of every object whose key starts with ``prefix``, sorted by key."""
        query, args = "SELECT key, size FROM objects", ()
        if prefix:
            # A key range uses the index; keys compare as UTF-8 bytes, i.e. by code point.
            query += " WHERE key >= ?"
            args = (prefix,)  # type: ignore[assignment]
            if ord(prefix[-1]) < 0x10FFFF:
                query += " AND key < ?"
                args = (prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1))  # type: ignore[assignment]
        with _sqlite_errors(f"scan {prefix!r}"):
            rows = self._conn().execute(query + " ORDER BY key", args).fetchall()
        return [(str(key), int(size)) for key, size in rows if key.startswith(prefix)]

    def delete(self, key: str) -> bool:
        """Remove the object; whether there was one."""
        with self._writing(f"delete {key!r}") as conn:
            return self._delete_in(conn, key)

    @staticmethod
    def _delete_in(conn: sqlite3.Connection, key: str) -> bool:
        row = conn.execute("SELECT blob_id FROM objects WHERE key = ?", (key,)).fetchone()
        if row is None:
            return False
        conn.execute("DELETE FROM chunks WHERE blob_id = ?", (row[0],))
        conn.execute("DELETE FROM objects WHERE blob_id = ?", (row[0],))
        return True


def _restore_client(db_path: str, chunk_size: int, busy_timeout_s: float) -> Client:
    if chunk_size == DEFAULT_CHUNK_SIZE and busy_timeout_s == DEFAULT_BUSY_TIMEOUT_S:
        return connect(db_path)
    return Client(db_path, chunk_size=chunk_size, busy_timeout_s=busy_timeout_s)


class _ObjectReader(io.RawIOBase):
    """One version of one object, read chunk by chunk inside a read transaction."""

    def __init__(self, client: Client, key: str) -> None:
        super().__init__()
        self._key = key
        self._conn: sqlite3.Connection | None = None
        with _sqlite_errors(f"open {key!r}"):
            conn = client._open_connection()
            try:
                # In WAL mode the first SELECT of a transaction fixes its snapshot: every
                # later chunk read sees the same version of the object.
                conn.execute("BEGIN")
                row = conn.execute(
                    "SELECT blob_id, size, chunk_size FROM objects WHERE key = ?", (key,)
                ).fetchone()
            except BaseException:
                conn.close()
                raise
        if row is None:
            conn.close()
            raise ObjectNotFound(key)
        self._conn = conn
        self._blob_id, self._size, self._chunk_size = (int(v) for v in row)
        self._pos = 0
        self._chunk_seq = -1
        self._chunk = b""

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self._size + offset
        else:
            raise ValueError(f"whence={whence!r} is not 0, 1 or 2")
        if pos < 0:
            raise ValueError(f"negative seek position {pos}")
        self._pos = pos
        return pos

    def _load(self, seq: int) -> bytes:
        if seq != self._chunk_seq:
            if self.closed or self._conn is None:
                raise ValueError("I/O operation on closed stream")
            with _sqlite_errors(f"read {self._key!r}"):
                row = self._conn.execute(
                    "SELECT data FROM chunks WHERE blob_id = ? AND seq = ?", (self._blob_id, seq)
                ).fetchone()
            if row is None:
                raise XyzError(f"read {self._key!r}: chunk {seq} is missing")
            self._chunk, self._chunk_seq = bytes(row[0]), seq
        return self._chunk

    def _take(self, limit: int) -> bytes:
        """Up to ``limit`` bytes from the current position, within one chunk."""
        if self.closed:
            raise ValueError("I/O operation on closed stream")
        if self._pos >= self._size or limit <= 0:
            return b""
        seq, offset = divmod(self._pos, self._chunk_size)
        piece = self._load(seq)[offset:offset + limit]
        self._pos += len(piece)
        return piece

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        piece = self._take(len(view))
        view[:len(piece)] = piece
        return len(piece)

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            return self.readall()
        parts: list[bytes] = []
        while size > 0 and (piece := self._take(size)):
            parts.append(piece)
            size -= len(piece)
        return b"".join(parts)

    def readall(self) -> bytes:
        return self.read(max(self._size - self._pos, 0))

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute("ROLLBACK")
            self._conn.close()
            self._conn = None
        super().close()
