"""A store whose streams return fewer bytes a read than asked (a raw stream) is read to
its end: Cairn's own files (index, manifests) come back whole, not cut at the first
chunk."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import BinaryIO

import pytest
from conftest import DictStore

from cairn._src.storage.fileio import read_bytes, write_bytes_atomic
from cairn._src.storage.location import resolve
from cairn._src.storage.reader import read_small_file
from cairn.storage import register_scheme, unregister_scheme

_SCHEME = "shortreadfs"
_CHUNK = 8192


class _RawChunks(io.RawIOBase):
    """A raw stream: every read returns at most ``_CHUNK`` bytes."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._at = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        size = min(len(buffer), _CHUNK, len(self._data) - self._at)
        buffer[:size] = self._data[self._at:self._at + size]
        self._at += size
        return size


class _RawStore(DictStore):
    def open_read(self, key: str) -> BinaryIO:
        data = self.objects.get(key)
        if data is None:
            raise FileNotFoundError(f"no object {key!r}")
        return _RawChunks(data)  # type: ignore[return-value]


@pytest.fixture
def raw_store() -> Iterator[_RawStore]:
    store = _RawStore()
    register_scheme(_SCHEME, lambda uri: store, overwrite=True)
    yield store
    unregister_scheme(_SCHEME)


def test_read_bytes_returns_every_byte_of_a_raw_stream(raw_store: _RawStore) -> None:
    data = bytes(range(256)) * 400  # 102,400 bytes, 13 chunks
    loc = resolve(f"{_SCHEME}://bucket/run/index.json")
    write_bytes_atomic(loc, data)
    assert read_bytes(loc) == data


def test_a_raw_stream_over_the_limit_is_still_refused(raw_store: _RawStore) -> None:
    loc = resolve(f"{_SCHEME}://bucket/run/big.json")
    write_bytes_atomic(loc, b"x" * (3 * _CHUNK))
    with pytest.raises(Exception, match="holds more than 20000 bytes"):
        read_small_file(loc, limit=20000)
    assert read_small_file(loc, limit=3 * _CHUNK) == b"x" * (3 * _CHUNK)

