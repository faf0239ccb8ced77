"""The scheme registry: in code, through entry points, and shipped to other processes."""

from __future__ import annotations

import pickle
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cairn._src.errors import ConfigError, UnknownSchemeError
from cairn._src.storage import fileio, registry
from cairn._src.storage.location import resolve
from cairn.storage import (
    export_registrations,
    import_registrations,
    register_scheme,
    registered_schemes,
    unregister_scheme,
)


@pytest.fixture
def clean_registry() -> Iterator[None]:
    """Run with the registry as it was, and restore it afterwards."""
    saved = export_registrations()
    try:
        yield
    finally:
        for scheme in export_registrations():
            unregister_scheme(scheme)
        import_registrations(saved)


def test_register_resolve_unregister(
    clean_registry: None, new_dict_store: Callable[[], Any]
) -> None:
    store = new_dict_store()
    register_scheme("regtest", lambda uri: store)
    assert "regtest" in registered_schemes()
    loc = resolve("regtest://bucket/a/b/?flavour=1")
    assert loc.path == "bucket/a/b"
    assert loc.uri == "regtest://bucket/a/b?flavour=1"
    assert loc.reachable_from_new_process
    fileio.write_bytes_atomic(loc.join("k.json"), b"{}")
    assert store.objects == {"bucket/a/b/k.json": b"{}"}
    assert loc.join("k.json").uri == "regtest://bucket/a/b/k.json?flavour=1"
    unregister_scheme("regtest")
    unregister_scheme("regtest")  # Unknown is ignored.
    with pytest.raises(UnknownSchemeError, match="unknown scheme 'regtest'"):
        resolve("regtest://bucket/a")


def test_factory_receives_the_whole_uri(clean_registry: None) -> None:
    seen: list[str] = []

    def factory(uri: str) -> Any:
        seen.append(uri)
        import fsspec

        return fsspec.filesystem("memory")

    register_scheme("seen", factory)
    resolve("seen://host/path?opt=1")
    assert seen == ["seen://host/path?opt=1"]


@pytest.mark.parametrize("bad", ["", "Xyz", "1abc", "a b", "s3://", "x_y", 5, None])
def test_bad_scheme_names(clean_registry: None, bad: Any) -> None:
    with pytest.raises(ConfigError, match=r"scheme=.* is not a valid URI scheme.*lower-case"):
        register_scheme(bad, lambda uri: None)


def test_file_scheme_is_reserved(clean_registry: None) -> None:
    with pytest.raises(ConfigError, match="scheme='file' is reserved"):
        register_scheme("file", lambda uri: None)


def test_factory_must_be_callable(clean_registry: None) -> None:
    with pytest.raises(ConfigError, match=r"factory='nope' for scheme 'abc' is not callable"):
        register_scheme("abc", "nope")  # type: ignore[arg-type]


def test_reregistering_needs_overwrite(clean_registry: None) -> None:
    def first(uri: str) -> Any:
        return None

    def second(uri: str) -> Any:
        return None

    register_scheme("dup", first)
    register_scheme("dup", first)  # The same factory again is a no-op.
    with pytest.raises(ConfigError, match=r"scheme='dup' is already registered.*overwrite=True"):
        register_scheme("dup", second)
    register_scheme("dup", second, overwrite=True)
    assert export_registrations()["dup"] is second


def test_factory_errors_name_the_scheme(clean_registry: None) -> None:
    def broken(uri: str) -> Any:
        raise RuntimeError("no credentials")

    register_scheme("broken", broken)
    with pytest.raises(Exception, match=r"factory registered for scheme 'broken' failed.*no cred"):
        resolve("broken://x")
    register_scheme("garbage", lambda uri: 42)
    with pytest.raises(ConfigError, match=r"scheme 'garbage' returned 42, which is not storage"):
        resolve("garbage://x")


def module_level_factory(uri: str) -> Any:
    import fsspec

    return fsspec.filesystem("memory")


def test_export_import_round_trip_through_pickle(clean_registry: None) -> None:
    register_scheme("shipped", module_level_factory)
    payload = pickle.dumps(export_registrations())
    unregister_scheme("shipped")
    assert "shipped" not in registered_schemes()
    import_registrations(pickle.loads(payload))
    loc = resolve("shipped://a/b")
    assert loc.path == "a/b"
    fileio.write_bytes_atomic(loc.join("c", "d"), b"x")
    assert fileio.list_files(loc) == {"c/d": 1}
    with pytest.raises(ConfigError, match="must be a dict of scheme -> factory"):
        import_registrations([("x", module_level_factory)])  # type: ignore[arg-type]


@pytest.fixture
def plugin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An installed distribution declaring two ``cairn.storage`` entry points."""
    site = tmp_path / "site"
    dist = site / "cairn_fake_plugin-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: cairn-fake-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[cairn.storage]\n"
        "epstore = cairn_fake_plugin:factory\n"
        "epbroken = cairn_fake_plugin_missing:factory\n"
    )
    (site / "cairn_fake_plugin.py").write_text(
        textwrap.dedent(
            """
            import fsspec
            LOADS = []

            def factory(uri):
                LOADS.append(uri)
                return fsspec.filesystem("memory")
            """
        )
    )
    monkeypatch.syspath_prepend(str(site))
    return site


def test_entry_point_schemes_are_listed_and_loaded_lazily(
    plugin_dir: Path, clean_registry: None
) -> None:
    import sys

    assert {"epstore", "epbroken"} <= set(registered_schemes())
    assert "cairn_fake_plugin" not in sys.modules  # Listed without importing.
    loc = resolve("epstore://bucket/x")
    assert loc.path == "bucket/x" and loc.uri == "epstore://bucket/x"
    assert sys.modules["cairn_fake_plugin"].LOADS == ["epstore://bucket/x"]
    registry._loaded_entry_points.pop("epstore", None)


def test_broken_entry_point_fails_only_its_scheme(plugin_dir: Path, clean_registry: None) -> None:
    with pytest.raises(UnknownSchemeError, match=r"plugin for scheme 'epbroken'.*failed to import"):
        resolve("epbroken://x")
    assert resolve("memory://still/works").path == "/still/works"


def test_code_registration_wins_over_entry_point(
    plugin_dir: Path, clean_registry: None, new_dict_store: Callable[[], Any]
) -> None:
    store = new_dict_store()
    register_scheme("epstore", lambda uri: store)
    fileio.write_bytes_atomic(resolve("epstore://b/k"), b"1")
    assert store.objects == {"b/k": b"1"}


def local_disk_factory(uri: str) -> Any:
    """``localdisk:///abs/path`` -> the local disk, path ``/abs/path``."""
    import pyarrow.fs as pafs

    return pafs.LocalFileSystem()


def _write_in_child(registrations: bytes, location: bytes, data: bytes) -> None:
    import cloudpickle

    from cairn._src.storage import fileio
    from cairn.storage import import_registrations

    import_registrations(cloudpickle.loads(registrations))
    fileio.write_bytes_atomic(cloudpickle.loads(location), data)


def test_custom_scheme_location_reaches_a_spawned_process(
    clean_registry: None, tmp_path: Path
) -> None:
    import multiprocessing

    import cloudpickle

    register_scheme("localdisk", local_disk_factory)
    loc = resolve(f"localdisk://{tmp_path}/run").join("checkpoint_000001", "marker")
    assert loc.uri == f"localdisk://{tmp_path}/run/checkpoint_000001/marker"
    child = multiprocessing.get_context("spawn").Process(
        target=_write_in_child,
        args=(cloudpickle.dumps(export_registrations()), cloudpickle.dumps(loc), b"from child"),
    )
    child.start()
    child.join(120)
    assert child.exitcode == 0
    assert (tmp_path / "run" / "checkpoint_000001" / "marker").read_bytes() == b"from child"
