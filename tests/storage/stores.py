"""Fakes for storage tests: stores and file systems that fail on purpose."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterable
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.fs as pafs

from cairn._src.storage.location import StorageLocation
from cairn.storage import ObjectInfo, ObjectStore, TransientStorageError


class FailureSchedule:
    """Fails every ``every``-th call on each key (a path), at most ``cap`` times per key.

    Counting per key, with a cap, keeps the failures deterministic under threads and
    guarantees that a retried operation eventually succeeds.
    """

    def __init__(self, every: int, cap: int = 2) -> None:
        self.every = every
        self.cap = cap
        self.calls: dict[str, int] = {}
        self.failed: dict[str, int] = {}
        self._lock = threading.Lock()

    @property
    def failures(self) -> int:
        return sum(self.failed.values())

    def maybe_fail(self, what: str, key: str) -> None:
        with self._lock:
            count = self.calls[key] = self.calls.get(key, 0) + 1
            fail = (
                self.every > 0 and count % self.every == 0 and self.failed.get(key, 0) < self.cap
            )
            if fail:
                self.failed[key] = self.failed.get(key, 0) + 1
        if fail:
            raise TransientStorageError(f"injected transient failure in {what} of {key!r}")


class _FlakyStream(io.RawIOBase):
    """Wraps a pyarrow stream; each read or write may fail per the schedule."""

    def __init__(
        self, inner: pa.NativeFile, schedule: FailureSchedule, writable: bool, key: str
    ) -> None:
        super().__init__()
        self._key = key
        self._inner = inner
        self._schedule = schedule
        self._writable = writable

    def readable(self) -> bool:
        return not self._writable

    def writable(self) -> bool:
        return self._writable

    def readinto(self, buffer: Any) -> int:
        self._schedule.maybe_fail("read", self._key)
        return int(self._inner.readinto(buffer))

    def write(self, data: Any) -> int:
        self._schedule.maybe_fail("write", self._key)
        self._inner.write(data)
        return memoryview(data).nbytes

    def close(self) -> None:
        if not self.closed:
            self._inner.close()
        super().close()


class FlakyHandler(pafs.FileSystemHandler):  # type: ignore[misc]
    """A file system over ``inner`` whose opens, reads and writes fail now and then."""

    def __init__(self, inner: pafs.FileSystem, schedule: FailureSchedule) -> None:
        self.inner = inner
        self.schedule = schedule

    def __eq__(self, other: object) -> bool:
        return other is self

    def __ne__(self, other: object) -> bool:
        return other is not self

    def __hash__(self) -> int:
        return id(self)

    def get_type_name(self) -> str:
        return "flaky"

    def normalize_path(self, path: str) -> str:
        return str(self.inner.normalize_path(path))

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        self.schedule.maybe_fail("get_file_info", ",".join(paths))
        return list(self.inner.get_file_info(paths))

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        self.schedule.maybe_fail("list", selector.base_dir)
        return list(self.inner.get_file_info(selector))

    def create_dir(self, path: str, recursive: bool) -> None:
        self.inner.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self.inner.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self.inner.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        self.inner.delete_dir_contents("/", accept_root_dir=True)

    def delete_file(self, path: str) -> None:
        self.inner.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        self.inner.move(src, dest)

    def copy_file(self, src: str, dest: str) -> None:
        self.inner.copy_file(src, dest)

    def open_input_stream(self, path: str) -> pa.NativeFile:
        self.schedule.maybe_fail("open_input_stream", path)
        inner = self.inner.open_input_stream(path)
        stream = _FlakyStream(inner, self.schedule, writable=False, key=path)
        return pa.PythonFile(stream, mode="r")

    def open_input_file(self, path: str) -> pa.NativeFile:
        return self.inner.open_input_file(path)

    def open_output_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        self.schedule.maybe_fail("open_output_stream", path)
        inner = self.inner.open_output_stream(path)
        stream = _FlakyStream(inner, self.schedule, writable=True, key=path)
        return pa.PythonFile(stream, mode="w")

    def open_append_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        raise NotImplementedError


def flaky_location(base: StorageLocation, schedule: FailureSchedule) -> StorageLocation:
    """``base`` seen through a :class:`FlakyHandler` (an explicit filesystem, no URI)."""
    fs = pafs.PyFileSystem(FlakyHandler(base.filesystem, schedule))
    return StorageLocation(fs, base.path, None)


class FlakyStore:
    """An ``ObjectStore`` wrapper failing every ``every``-th read or write transiently."""

    def __init__(self, inner: ObjectStore, every: int) -> None:
        self.inner = inner
        self.schedule = FailureSchedule(every)

    def open_read(self, key: str) -> BinaryIO:
        self.schedule.maybe_fail("open_read", key)
        return self.inner.open_read(key)

    def write(self, key: str, stream: BinaryIO) -> None:
        self.schedule.maybe_fail("write", key)
        self.inner.write(key, stream)

    def list(self, prefix: str) -> Iterable[ObjectInfo]:
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def stat(self, key: str) -> ObjectInfo | None:
        return self.inner.stat(key)


class DeniedStore:
    """An ``ObjectStore`` whose objects exist but cannot be read: a permanent error."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.read_attempts = 0

    def open_read(self, key: str) -> BinaryIO:
        self.read_attempts += 1
        raise PermissionError(13, "Access denied", key)

    def write(self, key: str, stream: BinaryIO) -> None:
        self.inner.write(key, stream)

    def list(self, prefix: str) -> Iterable[ObjectInfo]:
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def stat(self, key: str) -> ObjectInfo | None:
        return self.inner.stat(key)
