"""resolve(), StorageLocation and redact(): what users pass, and what comes back."""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cloudpickle
import fsspec
import pyarrow.fs as pafs
import pytest

from cairn._src.errors import ConfigError, UnknownSchemeError, UnsafePathError
from cairn._src.storage import fileio
from cairn._src.storage.location import (
    StorageLocation,
    local_root,
    redact,
    resolve,
    supports_atomic_rename,
)

S3_LOCAL = "s3://bkt/run/ckpt?endpoint_override=127.0.0.1:1&scheme=http&region=us-east-1"


def test_local_paths_resolve_to_absolute_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for given in ("runs/a", Path("runs/a"), f"{tmp_path}/runs/a/", f"file://{tmp_path}/runs/a"):
        loc = resolve(given)
        assert isinstance(loc.filesystem, pafs.LocalFileSystem)
        assert loc.path == f"{tmp_path}/runs/a"
        assert loc.uri == loc.path
        assert loc.reachable_from_new_process
    assert resolve("~/x").path == os.path.expanduser("~/x")


def test_file_uri_is_percent_decoded(tmp_path: Path) -> None:
    assert resolve(f"file://{tmp_path}/a%20b").path == f"{tmp_path}/a b"


def test_resolve_does_not_touch_storage(tmp_path: Path) -> None:
    loc = resolve(tmp_path / "does" / "not" / "exist")
    assert not fileio.exists(loc)


def test_s3_uri_with_query_parameters() -> None:
    loc = resolve(S3_LOCAL)
    assert loc.filesystem.type_name == "s3"
    assert loc.path == "bkt/run/ckpt"
    assert loc.uri == S3_LOCAL
    joined = loc.join("checkpoint 1", "model.pt")
    assert joined.path == "bkt/run/ckpt/checkpoint 1/model.pt"
    # pyarrow percent-decodes URI paths, so the joined URI quotes the space.
    assert joined.uri == (
        "s3://bkt/run/ckpt/checkpoint%201/model.pt"
        "?endpoint_override=127.0.0.1:1&scheme=http&region=us-east-1"
    )
    assert resolve(joined.uri).path == joined.path


def test_s3_bad_query_parameter_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"not a valid s3:// URI.*'colour'"):
        resolve("s3://bkt/x?endpoint_override=127.0.0.1:1&colour=red")


def test_memory_uri_is_fsspec_and_in_process() -> None:
    loc = resolve("memory://bucket/dir/")
    assert loc.filesystem.type_name == "py::fsspec+memory"
    assert loc.uri == "memory://bucket/dir"
    assert not loc.reachable_from_new_process
    assert not supports_atomic_rename(loc.filesystem)


def test_unknown_scheme_lists_known_ones_and_how_to_register() -> None:
    with pytest.raises(UnknownSchemeError) as info:
        resolve("nosuchstore://bucket/x")
    message = str(info.value)
    assert "unknown scheme 'nosuchstore'" in message
    assert "s3, " in message and "memory" in message and "file" in message
    assert "cairn.storage.register_scheme()" in message and "'cairn.storage'" in message


def test_scheme_needing_a_package_says_which_to_install() -> None:
    with pytest.raises(UnknownSchemeError, match=r"pip install adlfs"):
        resolve("az://container/path")


@pytest.mark.parametrize("bad", ["", "   ", 3, None, b"/tmp/x"])
def test_bad_location_values(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"location=.* is not a storage location"):
        resolve(bad)  # type: ignore[arg-type]


def test_explicit_pyarrow_local_filesystem_keeps_a_uri(tmp_path: Path) -> None:
    loc = resolve(str(tmp_path / "a"), filesystem=pafs.LocalFileSystem())
    assert loc.uri == str(tmp_path / "a")
    assert loc.reachable_from_new_process


def test_explicit_subtree_filesystem_over_local(tmp_path: Path) -> None:
    fs = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    loc = resolve("runs/a", filesystem=fs)
    assert loc.path == "runs/a"
    assert loc.uri == f"{tmp_path}/runs/a"
    assert local_root(fs) == str(tmp_path)
    assert supports_atomic_rename(fs)
    fileio.write_bytes_atomic(loc.join("f"), b"1")
    assert (tmp_path / "runs" / "a" / "f").read_bytes() == b"1"


def test_explicit_remote_filesystem_has_no_uri_and_pickles_the_filesystem() -> None:
    memory = fsspec.filesystem("memory")
    loc = resolve("/explicit/dir", filesystem=memory)
    assert loc.uri is None and not loc.reachable_from_new_process
    fileio.write_bytes_atomic(loc.join("f"), b"explicit")
    again = pickle.loads(pickle.dumps(loc))
    assert fileio.read_bytes(again.join("f")) == b"explicit"
    assert "on a py::fsspec+memory filesystem" in loc.display()


def test_scheme_prefix_is_stripped_with_an_explicit_filesystem() -> None:
    loc = resolve("memory://explicit/x", filesystem=fsspec.filesystem("memory"))
    assert loc.path == "/explicit/x"


def test_factory_filesystem_pickles_the_factory(new_dict_store: Callable[[], Any]) -> None:
    store = new_dict_store()
    loc = resolve("bucket/prefix", filesystem=lambda: store)
    assert loc.path == "bucket/prefix" and loc.uri is None
    fileio.write_bytes_atomic(loc.join("f"), b"via factory")
    assert store.objects == {"bucket/prefix/f": b"via factory"}

    # A factory that builds its storage (rather than capturing an object) travels.
    built = resolve("/factory/prefix", filesystem=lambda: fsspec.filesystem("memory"))
    fileio.write_bytes_atomic(built.join("f"), b"built")
    payload = cloudpickle.dumps(built)
    again = cloudpickle.loads(payload)
    assert again.uri is None and again.path == "/factory/prefix"
    assert fileio.read_bytes(again.join("f")) == b"built"


def test_object_store_instance_as_filesystem(new_dict_store: Callable[[], Any]) -> None:
    store = new_dict_store()
    loc = resolve("/b/p/", filesystem=store)
    fileio.write_bytes_atomic(loc.join("k"), b"v")
    assert store.objects == {"b/p/k": b"v"}


@pytest.mark.parametrize("bad", [42, "not a filesystem", object()])
def test_bad_filesystem_values(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"filesystem=.* is not storage Cairn can use"):
        resolve("x", filesystem=bad)


def test_factory_returning_garbage_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"factory .* returned 42, which is not storage"):
        resolve("x", filesystem=lambda: 42)


def test_uri_location_pickles_as_its_uri(dict_store: Any) -> None:
    loc = resolve("dictstore://bucket/pickled").join("a")
    payload = pickle.dumps(loc)
    assert b"DictStore" not in payload  # The store itself does not travel, only the URI.
    again = pickle.loads(payload)
    assert again.uri == loc.uri and again.path == "bucket/pickled/a"


def test_join_refuses_escaping_parts() -> None:
    loc = resolve("memory://bucket/x")
    with pytest.raises(UnsafePathError, match=r"'\.\.' component"):
        loc.join("..", "y")
    assert loc.join() is loc
    assert loc.join("a/b", "c").path == "/bucket/x/a/b/c"


def test_local_join_with_odd_characters(tmp_path: Path) -> None:
    loc = resolve(str(tmp_path)).join("a?b#c")
    assert loc.uri == f"{tmp_path}/a?b#c"
    assert resolve(loc.uri).path == loc.path


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("s3://bkt/x?access_key=AKIA&secret_key=SECRET&region=eu",
         "s3://bkt/x?access_key=***&secret_key=***&region=eu"),
        ("s3://bkt/x?session_token=T&scheme=http", "s3://bkt/x?session_token=***&scheme=http"),
        ("ftp://user:hunter2@host/path", "ftp://user:***@host/path"),
        ("hdfs://:pw@host/path", "hdfs://***@host/path"),
        ("xyz://bucket/a?password=p&x=1", "xyz://bucket/a?password=***&x=1"),
        ("/local/path?secret_key=not-a-query", "/local/path?secret_key=not-a-query"),
        ("memory://plain", "memory://plain"),
    ],
)
def test_redact(uri: str, expected: str) -> None:
    assert redact(uri) == expected


def test_display_and_str_are_redacted() -> None:
    loc = resolve(
        "s3://AKIA:TOPSECRET@bkt/x?endpoint_override=127.0.0.1:1&scheme=http&region=us-east-1"
    )
    assert "TOPSECRET" not in loc.display() and "TOPSECRET" not in str(loc)
    assert loc.display().startswith("s3://AKIA:***@bkt/x?")
    with pytest.raises(ConfigError) as info:
        resolve("s3://AKIA:TOPSECRET@bkt/x y")
    assert "TOPSECRET" not in str(info.value)


def test_supports_atomic_rename(new_dict_store: Callable[[], Any]) -> None:
    assert supports_atomic_rename(pafs.LocalFileSystem())
    assert supports_atomic_rename(pafs.PyFileSystem(pafs.FSSpecHandler(fsspec.filesystem("file"))))
    assert not supports_atomic_rename(resolve(S3_LOCAL).filesystem)
    assert not supports_atomic_rename(resolve("x", filesystem=new_dict_store()).filesystem)


def test_locations_are_immutable_values() -> None:
    a = resolve("memory://bucket/v")
    b = resolve("memory://bucket/v")
    assert a == b and hash(a) == hash(b) and len({a, b, a.join("c")}) == 2
    with pytest.raises(AttributeError):
        a.path = "other"  # type: ignore[misc]
    assert isinstance(a, StorageLocation)


def test_locations_with_one_uri_are_equal_whatever_store_object_backs_them(
    new_dict_store: Callable[[], Any],
) -> None:
    from cairn.storage import register_scheme, unregister_scheme

    register_scheme("freshstore", lambda uri: new_dict_store())
    try:
        first, second = resolve("freshstore://b/ckpt"), resolve("freshstore://b/ckpt")
        assert first == second and hash(first) == hash(second)
        assert first != resolve("freshstore://b/other")
    finally:
        unregister_scheme("freshstore")


def test_inside_ignores_query_parameters_but_requires_the_same_store() -> None:
    run = resolve("s3://bucket/runs/r?endpoint_override=127.0.0.1:9&scheme=http")
    assert run.contains(run.join("checkpoint_000001"), strictly=True)
    assert not run.contains(resolve("s3://bucket/runs/r/x?endpoint_override=127.0.0.1:8&"
                                    "scheme=http"), strictly=True)
    assert not run.contains(resolve("s3://bucket/runs/rr?endpoint_override=127.0.0.1:9&"
                                    "scheme=http"), strictly=True)
