"""Credentials in a storage URI stay in memory: never in a key a custom store is given,
never in a display, never in an error (an AWS secret key holds '/', which ends a URI's
authority), and query parameters named like API keys count as credentials."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import fsspec
import pyarrow.fs as pafs
import pytest
from conftest import DictStore

from cairn._src.errors import ConfigError
from cairn._src.storage.fileio import read_bytes, write_bytes_atomic
from cairn._src.storage.location import resolve
from cairn._src.storage.uris import credentials_in, public_uri, redact, scrub
from cairn.storage import register_scheme, unregister_scheme

_SCHEME = "credtestfs"
_AWS = "s3://AKIAEXAMPLE:wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY@bucket/runs"


@pytest.fixture
def store() -> Iterator[tuple[DictStore, list[str]]]:
    made = DictStore()
    asked: list[str] = []

    def factory(uri: str) -> DictStore:
        asked.append(uri)
        return made

    register_scheme(_SCHEME, factory, overwrite=True)
    yield made, asked
    unregister_scheme(_SCHEME)


def test_a_custom_scheme_keeps_the_user_info_out_of_its_keys(
        store: tuple[DictStore, list[str]]) -> None:
    objects, asked = store
    loc = resolve(f"{_SCHEME}://u:p@b/r")
    write_bytes_atomic(loc.join("checkpoint_000001", "index.json"), b"{}")
    assert list(objects.objects) == ["b/r/checkpoint_000001/index.json"]
    assert not [key for key in objects.objects if "p@" in key]
    assert loc.path == "b/r"
    assert asked[0] == f"{_SCHEME}://u:p@b/r"  # the factory still gets the credentials
    assert loc.public_uri == f"{_SCHEME}://b/r"
    assert resolve(loc.public_uri).path == loc.path
    assert read_bytes(resolve(loc.public_uri).join("checkpoint_000001", "index.json")) == b"{}"
    for shown in (loc.display(), str(loc), repr(loc), loc.join("x").display()):
        assert "p@" not in shown


def test_a_password_with_slashes_is_never_echoed() -> None:
    with pytest.raises(ConfigError) as raised:
        resolve(_AWS)
    for secret_part in ("K7MDENG", "wJalrXUtnFEMI", "bPxRfiCYEXAMPLEKEY"):
        assert secret_part not in str(raised.value)
    assert raised.value.__cause__ is None
    assert "s3://AKIAEXAMPLE:***@bucket/runs" in str(raised.value)


def test_a_password_with_slashes_is_found_masked_and_dropped() -> None:
    assert credentials_in(_AWS) == ["a password in its user info ('user:password@')"]
    assert redact(_AWS) == "s3://AKIAEXAMPLE:***@bucket/runs"
    assert public_uri(_AWS) == "s3://bucket/runs"
    quoted = "syntax error in 'K7MDENG/bPxRfiCYEXAMPLEKEY@bucket'"
    assert "K7MDENG" not in scrub(quoted, _AWS)
    assert "EXAMPLEKEY" not in scrub(quoted, _AWS)


def test_an_at_sign_in_a_path_is_no_user_info() -> None:
    for uri in ("s3://bucket/runs/alice@corp", "hdfs://namenode:8020/user/alice@corp/x"):
        assert credentials_in(uri) == []
        assert public_uri(uri) == uri


@pytest.mark.parametrize("name", ["api_key", "apikey", "account_key", "key", "API_KEY",
                                  "x_api_key", "storage_account_key"])
def test_key_parameters_are_credentials(name: str) -> None:
    uri = f"myfs://b/p?{name}=hunter2&region=x"
    assert credentials_in(uri) == [f"the query parameter {name!r}"]
    assert redact(uri) == f"myfs://b/p?{name}=***&region=x"
    assert public_uri(uri) == "myfs://b/p?region=x"


def test_a_name_that_merely_contains_key_is_no_credential() -> None:
    assert credentials_in("myfs://b/p?keyfile=/etc/k&monkey=1") == []


@pytest.mark.parametrize(("uri", "filesystem"), [
    ("s3://bucket/x", pafs.LocalFileSystem()),
    ("gs://bucket/x", fsspec.filesystem("memory")),
])
def test_a_uri_with_a_file_system_of_another_scheme_is_refused(
        uri: str, filesystem: object) -> None:
    # The rest of the URI would be taken for a path there (s3://bucket/x on the local
    # disk: ./bucket/x), as pyarrow refuses a URI for a local file system.
    with pytest.raises(ConfigError, match=rf"location='{uri}' is a \w+:// URI, but the file "
                                          r"system given with it \(\w+\) serves .*:// only\. "
                                          r"Pass a path on that file system"):
        resolve(uri, filesystem=filesystem)


def test_a_uri_of_the_file_systems_own_scheme_is_a_path_on_it(tmp_path: Path) -> None:
    assert resolve(f"file://{tmp_path}", filesystem=pafs.LocalFileSystem()).path == str(tmp_path)
    assert resolve("memory://bucket/x", filesystem=fsspec.filesystem("memory")).path.endswith(
        "bucket/x")
