"""A second custom store, written from docs/custom-storage.md alone (not from Cairn's code).

It checks that the guide is enough: tests/storage/xyz/test_xyz_guide_only.py runs the NO_UPLOAD
scenario with worker and driver crashes on it, and the conformance suite.

Design, rule by rule from the guide:

* Keys are flat. Each object is one file in a single directory, named by its key
  percent-encoded (``bucket/a/b`` becomes ``bucket%2Fa%2Fb``), so no directories exist.
* ``write`` is atomic: it writes a temporary file next to the target, then ``os.replace``.
* Missing objects: ``open_read`` raises ``FileNotFoundError``, ``stat`` returns ``None``,
  and ``delete`` ignores them.
* Threads and processes: no shared mutable state, every call works on the file system.
* Target and registration: URIs are ``flatdir://<key>?root=/abs/dir``. The factory
  returns one store per root (the guide's "one store per target"), and the store pickles
  as its root. It is registered in code, which Cairn sends to workers (by reference,
  since this module is importable).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import urllib.parse
from typing import BinaryIO

from cairn.storage import ObjectInfo, register_scheme

_TEMPORARY_PREFIX = ".partial-"


class FlatDirStore:
    """Objects as files of one flat directory; thread- and process-safe."""

    def __init__(self, root: str) -> None:
        self.root = root
        os.makedirs(root, exist_ok=True)

    def _path(self, key: str) -> str:
        return os.path.join(self.root, urllib.parse.quote(key, safe=""))

    def open_read(self, key: str) -> BinaryIO:
        return open(self._path(key), "rb")

    def write(self, key: str, stream: BinaryIO) -> None:
        fd, temporary = tempfile.mkstemp(dir=self.root, prefix=_TEMPORARY_PREFIX)
        try:
            with os.fdopen(fd, "wb") as f:
                shutil.copyfileobj(stream, f)
            os.replace(temporary, self._path(key))
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.remove(temporary)
            raise

    def list(self, prefix: str) -> list[ObjectInfo]:
        found = []
        with os.scandir(self.root) as entries:
            for entry in entries:
                if entry.name.startswith(_TEMPORARY_PREFIX):
                    continue
                key = urllib.parse.unquote(entry.name)
                if not key.startswith(prefix):
                    continue
                try:
                    found.append(ObjectInfo(key, entry.stat().st_size))
                except FileNotFoundError:
                    continue  # deleted meanwhile
        return sorted(found)

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(self._path(key))

    def stat(self, key: str) -> ObjectInfo | None:
        try:
            return ObjectInfo(key, os.stat(self._path(key)).st_size)
        except FileNotFoundError:
            return None

    def __reduce__(self) -> tuple[object, ...]:
        return (_store_for_root, (self.root,))


_stores: dict[str, FlatDirStore] = {}
_lock = threading.Lock()


def _store_for_root(root: str) -> FlatDirStore:
    with _lock:
        if root not in _stores:
            _stores[root] = FlatDirStore(root)
        return _stores[root]


def flatdir_store(uri: str) -> FlatDirStore:
    """``flatdir://bucket/key?root=/abs/dir`` -> the one store of that directory."""
    roots = urllib.parse.parse_qs(urllib.parse.urlsplit(uri).query).get("root")
    if not roots or not os.path.isabs(roots[-1]):
        raise ValueError(f"{uri!r} needs '?root=/absolute/directory'")
    return _store_for_root(os.path.normpath(roots[-1]))


register_scheme("flatdir", flatdir_store)
