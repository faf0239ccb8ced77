"""The ObjectStore adapter: directories from prefixes, buffered writes, error passing."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any, BinaryIO

import pyarrow.fs as pafs
import pytest

from cairn._src.storage import object_store
from cairn.storage import ObjectStore, object_store_filesystem


@pytest.fixture
def store(new_dict_store: Callable[[], Any]) -> Any:
    made = new_dict_store()
    for key, data in {"b/x/1": b"1", "b/x/y/2": b"22", "b/z": b"333", "top": b""}.items():
        made.objects[key] = data
    return made


def test_dict_store_is_an_object_store(store: Any) -> None:
    assert isinstance(store, ObjectStore)
    assert object_store.is_object_store(store)
    assert not object_store.is_object_store(pafs.LocalFileSystem())


def test_file_info(store: Any) -> None:
    fs = object_store_filesystem(store)
    infos = fs.get_file_info(["b", "/b/x", "b/z", "b/nope", "", "top"])
    assert [i.type for i in infos] == [
        pafs.FileType.Directory, pafs.FileType.Directory, pafs.FileType.File,
        pafs.FileType.NotFound, pafs.FileType.Directory, pafs.FileType.File,
    ]
    assert infos[2].size == 3


def test_selector_lists_implicit_directories(store: Any) -> None:
    fs = object_store_filesystem(store)
    flat = fs.get_file_info(pafs.FileSelector("b"))
    assert [(i.path, i.type) for i in flat] == [
        ("b/x", pafs.FileType.Directory), ("b/z", pafs.FileType.File),
    ]
    deep = fs.get_file_info(pafs.FileSelector("b", recursive=True))
    assert [i.path for i in deep] == ["b/x", "b/x/1", "b/x/y", "b/x/y/2", "b/z"]
    with pytest.raises(FileNotFoundError):
        fs.get_file_info(pafs.FileSelector("missing"))
    assert fs.get_file_info(pafs.FileSelector("missing", allow_not_found=True)) == []
    with pytest.raises(NotADirectoryError):
        fs.get_file_info(pafs.FileSelector("b/z"))


def test_delete_move_copy(store: Any) -> None:
    fs = object_store_filesystem(store)
    fs.copy_file("b/z", "c/z")
    fs.move("b/x/1", "c/1")
    fs.delete_dir("b/x")
    fs.delete_file("top")
    fs.delete_file("top")
    assert store.objects == {"b/z": b"333", "c/z": b"333", "c/1": b"1"}
    fs.create_dir("anything/at/all")  # Directories are implicit: nothing happens.
    fs.delete_dir_contents("c")
    assert store.objects == {"b/z": b"333"}


def test_large_writes_spill_and_arrive_whole(store: Any) -> None:
    fs = object_store_filesystem(store)
    big = bytes(range(256)) * (object_store.SPILL_THRESHOLD_BYTES // 256 + 1000)
    with fs.open_output_stream("big") as out:
        for start in range(0, len(big), 1 << 20):
            out.write(big[start:start + (1 << 20)])
        assert "big" not in store.objects  # Written once, on close.
    assert store.objects["big"] == big
    with fs.open_input_stream("big") as stream:
        assert stream.read() == big


class _UnseekableStore:
    """Streams that cannot seek, like an HTTP response body."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def open_read(self, key: str) -> BinaryIO:
        data = self.inner.open_read(key).read()

        class Stream(io.RawIOBase):
            def __init__(self) -> None:
                self._buffer = io.BytesIO(data)

            def readable(self) -> bool:
                return True

            def readinto(self, b: Any) -> int:
                return self._buffer.readinto(b)

        return io.BufferedReader(Stream())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_random_access_on_unseekable_streams(store: Any) -> None:
    wrapped = _UnseekableStore(store)
    fs = pafs.PyFileSystem(object_store.ObjectStoreHandler(wrapped))
    with fs.open_input_file("b/z") as f:
        assert f.read_at(2, 1) == b"33"


def test_appends_are_refused(store: Any) -> None:
    fs = object_store_filesystem(store)
    with pytest.raises(NotImplementedError, match="do not support appends"):
        fs.open_append_stream("b/z")


def test_store_errors_pass_through_unchanged(store: Any) -> None:
    fs = object_store_filesystem(store)
    with pytest.raises(FileNotFoundError, match="no object 'nope'"):
        fs.open_input_stream("nope")
