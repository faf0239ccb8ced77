"""A custom store over a local directory that injects faults, registered as ``faultfs://``.

URI: ``faultfs:///abs/root?fail_ratio=0.2&seed=1&slow=cairn_run.json&slow_s=2``

* ``fail_ratio``: share of operations that raise a transient error (retried by Cairn);
* ``enospc``: keys containing this text fail to write with ``ENOSPC`` (permanent);
* ``slow`` / ``slow_s``: writes of keys containing ``slow`` sleep first (to kill the driver
  in the middle of a commit);
* ``outage`` / ``outage_key``: while the file ``outage`` holds a count above 0, each
  operation on a key containing ``outage_key`` takes one off it and raises a transient
  error (an outage any process can start by writing the count); with
  ``outage_permanent=1``, an error no retry fixes (permission denied).
"""

from __future__ import annotations

import errno
import fcntl
import io
import os
import random
import shutil
import threading
import time
import urllib.parse
from collections.abc import Iterator
from typing import BinaryIO

from cairn.storage import ObjectInfo, TransientStorageError, register_scheme


class FaultStore:
    def __init__(self, root: str, *, fail_ratio: float = 0.0, seed: int | None = None,
                 enospc: str = "", slow: str = "", slow_s: float = 0.0,
                 outage: str = "", outage_key: str = "", outage_permanent: bool = False,
                 ) -> None:
        self.root = root
        self.fail_ratio = fail_ratio
        self.enospc = enospc
        self.slow = slow
        self.slow_s = slow_s
        self.outage = outage
        self.outage_key = outage_key
        self.outage_permanent = outage_permanent
        self._random = random.Random(None if seed is None else seed + os.getpid())
        self._lock = threading.Lock()
        self.failures = 0

    def _maybe_fail(self, what: str, key: str) -> None:
        with self._lock:
            fail = self._random.random() < self.fail_ratio
            self.failures += fail
        if fail:
            raise TransientStorageError(f"injected transient failure in {what} {key!r}")
        if self.outage and self.outage_key in key and _take_one(self.outage):
            if self.outage_permanent:
                raise PermissionError(errno.EACCES, f"injected permanent error in {what}", key)
            raise TransientStorageError(f"injected outage in {what} {key!r}")

    def _path(self, key: str) -> str:
        return os.path.join(self.root, key)

    def open_read(self, key: str) -> BinaryIO:
        self._maybe_fail("read", key)
        with open(self._path(key), "rb") as f:
            return io.BytesIO(f.read())

    def write(self, key: str, stream: BinaryIO) -> None:
        self._maybe_fail("write", key)
        if self.enospc and self.enospc in key:
            raise OSError(errno.ENOSPC, "No space left on device (injected)", key)
        if self.slow and self.slow in key:
            time.sleep(self.slow_s)
        path = self._path(key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        temporary = f"{path}.part-{os.getpid()}-{threading.get_ident()}"
        with open(temporary, "wb") as f:
            shutil.copyfileobj(stream, f)
        os.replace(temporary, path)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        self._maybe_fail("list", prefix)
        for directory, _, names in os.walk(self.root):
            for name in names:
                if ".part-" in name:
                    continue
                full = os.path.join(directory, name)
                key = os.path.relpath(full, self.root).replace(os.sep, "/")
                if key.startswith(prefix):
                    yield ObjectInfo(key, os.path.getsize(full))

    def delete(self, key: str) -> None:
        self._maybe_fail("delete", key)
        try:
            os.remove(self._path(key))
        except FileNotFoundError:
            pass

    def stat(self, key: str) -> ObjectInfo | None:
        self._maybe_fail("stat", key)
        path = self._path(key)
        return ObjectInfo(key, os.path.getsize(path)) if os.path.isfile(path) else None


def _take_one(counter: str) -> bool:
    """Take one off the count in the file ``counter``; False when it is 0 or missing."""
    try:
        with open(counter, "r+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            left = int(f.read().strip() or 0)
            if left <= 0:
                return False
            f.seek(0)
            f.truncate()
            f.write(str(left - 1))
            return True
    except FileNotFoundError:
        return False


def faultfs_factory(uri: str) -> FaultStore:
    parsed = urllib.parse.urlsplit(uri)
    options = dict(urllib.parse.parse_qsl(parsed.query))
    return FaultStore(
        options["root"],
        fail_ratio=float(options.get("fail_ratio", 0.0)),
        seed=int(options["seed"]) if "seed" in options else None,
        enospc=options.get("enospc", ""),
        slow=options.get("slow", ""),
        slow_s=float(options.get("slow_s", 0.0)),
        outage=options.get("outage", ""),
        outage_key=options.get("outage_key", ""),
        outage_permanent=options.get("outage_permanent") == "1",
    )


def register() -> None:
    register_scheme("faultfs", faultfs_factory, overwrite=True)


def faultfs_uri(root: str, **options: object) -> str:
    os.makedirs(root, exist_ok=True)
    query = urllib.parse.urlencode({"root": root, **options})
    return f"faultfs://storage?{query}"
