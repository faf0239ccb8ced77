"""The manifest: its JSON format, validation, and reading damaged ones."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from cairn._src.checkpoint.manifest import (
    MANIFEST_NAME,
    MANIFEST_VERSION,
    Manifest,
    check_json_value,
    read_manifest,
    write_manifest,
)
from cairn._src.errors import ConfigError, ManifestError, UnsafePathError
from cairn._src.storage import fileio
from cairn._src.storage.location import resolve
from cairn._src.storage.transfer import CHECKSUM_ALGORITHM, FileEntry

ENTRY = FileEntry(size=3, checksum="ab" * 16)


def make(**overrides: object) -> Manifest:
    fields: dict[str, object] = {
        "files": {"model/weights.pt": ENTRY, "empty": FileEntry(0, "cd" * 16)},
        "metadata": {"epoch": 3, "tags": ["a", "b"]},
        "report_index": 7,
        "metrics": {"loss": 0.25, "nan_loss": math.nan},
        "ranks": (0, 1),
        "created_at": 1700000000.5,
    }
    fields.update(overrides)
    return Manifest(**fields)  # type: ignore[arg-type]


def test_round_trip() -> None:
    manifest = make(target_uri="s3://other/bucket")
    again = Manifest.from_json(manifest.to_json(), where="test")
    assert again.files == manifest.files and again.ranks == (0, 1)
    assert again.metadata == manifest.metadata and again.report_index == 7
    assert math.isnan(again.metrics["nan_loss"])
    assert again.target_uri == "s3://other/bucket"
    assert again.version == MANIFEST_VERSION and again.checksum_algorithm == CHECKSUM_ALGORITHM
    assert manifest.total_bytes == 3


def test_json_is_versioned_and_stable() -> None:
    document = json.loads(make().to_json())
    assert document["version"] == 1 and document["checksum_algorithm"] == "xxh3_128"
    assert document["files"]["empty"] == {"size": 0, "checksum": "cd" * 16}
    assert make().to_json() == make().to_json()


def test_defaults() -> None:
    manifest = Manifest(files={})
    assert manifest.metadata == {} and manifest.metrics == {} and manifest.ranks == ()
    assert manifest.report_index is None and manifest.target_uri is None
    assert manifest.created_at > 1.6e9


def test_not_json() -> None:
    with pytest.raises(ManifestError, match=r"The manifest here is not valid JSON"):
        Manifest.from_json(b"{not json", where="here")
    with pytest.raises(ManifestError, match="is not valid JSON"):
        Manifest.from_json(b"\xff\xfe", where="here")


def test_unknown_version() -> None:
    data = json.dumps({**json.loads(make().to_json()), "version": 7}).encode()
    with pytest.raises(ManifestError, match=r"has version 7; this Cairn reads versions 1"):
        Manifest.from_json(data, where="x")
    with pytest.raises(ManifestError, match="has version None"):
        Manifest.from_json(b"{}", where="x")


def test_not_an_object() -> None:
    with pytest.raises(ManifestError, match="holds a JSON list, not an object"):
        Manifest.from_json(b"[1, 2]", where="x")


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"files": {"a": {"size": -1, "checksum": "x"}}},
         r"field \"files\['a'\]\.size\" is -1 \(int\); expected an integer >= 0\."),
        ({"files": {"a": {"size": "3", "checksum": "x"}}},
         r"field \"files\['a'\]\.size\" is '3' \(str\); expected an integer >= 0"),
        ({"files": {"a": {"size": 3, "checksum": "x"}}},
         r"field \"files\['a'\]\.checksum\" is 'x' \(str\); expected 32 lowercase hex"),
        ({"files": {"../../x": {"size": 1, "checksum": "x"}}},
         r"field \"files\['\.\./\.\./x'\]\" is '\.\./\.\./x' \(str\); expected a key that "
         r"is a normalized relative path such as 'model/weights\.pt'\."),
        ({"files": {"a//b": {"size": 1, "checksum": "ab" * 16}}},
         r"field \"files\['a//b'\]\" is 'a//b' \(str\); expected a key that is a normalized "
         r"relative path such as 'model/weights\.pt'\. The checkpoint is damaged"),
        ({"files": {"a": {"size": True, "checksum": "ab" * 16}}},
         r"field \"files\['a'\]\.size\" is True \(bool\); expected an integer >= 0"),
        ({"files": {"a": {"size": 1, "checksum": "AB" * 16}}},
         r"field \"files\['a'\]\.checksum\" is 'ABAB.*' \(str\); expected 32 lowercase hex"),
        ({"files": {"a": {"size": 1}}},
         r"field \"files\['a'\]\.checksum\" is missing; expected 32 lowercase hex"),
        ({"files": {"a": [1, "ab" * 16]}},
         r"field \"files\['a'\]\" is a list of 2 values; expected \{'size': int >= 0, "),
        ({"files": []}, r"field 'files' is a list of 0 values; expected an object of relative "
                        r"path -> \{'size', 'checksum'\}\."),
        ({"report_index": "3"},
         r"field 'report_index' is '3' \(str\); expected null or an integer >= 0\."),
        ({"report_index": True},
         r"field 'report_index' is True \(bool\); expected null or an integer >= 0\."),
        ({"created_at": None}, r"field 'created_at' is None \(NoneType\); expected a finite "
                               r"number\."),
        ({"created_at": math.inf}, r"field 'created_at' is inf \(float\); expected a finite"),
        ({"ranks": [0, "1"]}, r"field 'ranks\[1\]' is '1' \(str\); expected an integer >= 0\."),
        ({"checksum_algorithm": "md5"},
         r"field 'checksum_algorithm' is 'md5' \(str\); expected one of xxh3_128\."),
        ({"metrics": {"a": 1, "deep": json.loads("[" * 600 + "]" * 600)}},
         r"field 'metrics' is an object with 2 keys; expected an object nested at most 128 "
         r"levels deep\."),
        ({"target_path": "relative"},
         r"field 'target_path' is 'relative' \(str\); expected null or a normalized absolute"),
    ],
)
def test_invalid_fields(change: dict[str, object], match: str) -> None:
    document = {**json.loads(make().to_json()), **change}
    with pytest.raises(ManifestError, match=r"^The manifest x is invalid: " + match):
        Manifest.from_json(json.dumps(document).encode(), where="x")


def test_one_bad_entry_among_many_is_named() -> None:
    # Entries are checked in one pass and their checksums matched together; a bad one
    # anywhere still gets the schema's message naming it.
    files = {f"d{i // 100}/f{i:04d}.bin": {"size": i, "checksum": f"{i:032x}"}
             for i in range(1000)}
    files["d5/f0500.bin"]["checksum"] = "g" * 32
    document = {**json.loads(make().to_json()), "files": files}
    with pytest.raises(ManifestError, match=r"field \"files\['d5/f0500\.bin'\]\.checksum\" "
                                            r"is 'gggg.*' \(str\); expected 32 lowercase hex"):
        Manifest.from_json(json.dumps(document).encode(), where="x")
    del files["d5/f0500.bin"]
    files[".hidden/x"] = {"size": 1, "checksum": "ab" * 16, "note": "extra keys are ignored"}
    manifest = Manifest.from_json(json.dumps({**document, "files": files}).encode(), where="x")
    assert len(manifest.files) == 1000 and manifest.files[".hidden/x"] == FileEntry(1, "ab" * 16)
    assert manifest.files["d1/f0100.bin"] == FileEntry(100, f"{100:032x}")


def test_a_file_and_a_file_under_it_are_refused() -> None:
    document = json.loads(make().to_json())
    document["files"] = {"x": {"size": 1, "checksum": "ab" * 16},
                         "x/y/z": {"size": 1, "checksum": "ab" * 16}}
    with pytest.raises(ManifestError, match=r"^The manifest x is invalid: Manifest\.files lists "
                       r"both 'x' and 'x/y/z': 'x' cannot be a file and a directory at once\."):
        Manifest.from_json(json.dumps(document).encode(), where="x")
    with pytest.raises(UnsafePathError, match=r"lists both 'a' and 'a/b'"):
        make(files={"a": ENTRY, "a/b": ENTRY})
    make(files={"a": ENTRY, "ab/c": ENTRY, "a.b/c": ENTRY})  # Prefixes of names are fine.
    # Among many names in a few directories, a file that is an ancestor of another's
    # directory, at any depth, is still found and named.
    many = {f"d{i % 10}/e{i % 3}/f{i}": ENTRY for i in range(3000)}
    make(files=many)
    for clash in ("d4", "d4/e1"):
        with pytest.raises(UnsafePathError, match=rf"lists both '{clash}' and '{clash}/"):
            make(files={**many, clash: ENTRY})


def test_a_bad_key_or_entry_among_many_built_in_code_is_named() -> None:
    # Keys are checked all at once; the one that fails is still named.
    many = {f"d{i % 10}/f{i}": ENTRY for i in range(1000)}
    for key, match in (("d1/./x", r"Manifest\.files key 'd1/\./x' is not in normal form; "
                                  r"use 'd1/x'\."),
                       ("../x", r"Manifest\.files key='\.\./x' contains a '\.\.' component"),
                       ("_cairn_manifest.json", r"must not list the manifest itself")):
        with pytest.raises((UnsafePathError, ConfigError), match=match):
            make(files={**many, key: ENTRY})
    with pytest.raises(ConfigError, match=r"Manifest\.files\['d0/x'\]=\(1, 'ab'\) must be a "
                                          r"FileEntry\(size, checksum\)\."):
        make(files={**many, "d0/x": (1, "ab")})  # type: ignore[dict-item]
    assert len(make(files={**many, "d0/line\nbreak": ENTRY}).files) == 1001


def test_json_nested_beyond_the_parser_is_a_manifest_error() -> None:
    deep = b'{"version": 1, "metadata": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    with pytest.raises(ManifestError, match=r"^The manifest x is not a file Cairn wrote: its "
                       r"JSON is nested too deeply to parse\."):
        Manifest.from_json(deep, where="x")


def test_user_metadata_depth_is_limited() -> None:
    nested: dict[str, object] = {}
    inner = nested
    for _ in range(70):
        inner["a"] = {}
        inner = inner["a"]  # type: ignore[assignment]
    with pytest.raises(ConfigError, match=r"^metadata is nested more than 64 levels deep"):
        check_json_value(nested, argument="metadata")
    make(metadata=nested)  # Read back from storage, deeper values still load.


def test_missing_field() -> None:
    document = json.loads(make().to_json())
    del document["files"]
    with pytest.raises(ManifestError, match="field 'files' is missing"):
        Manifest.from_json(json.dumps(document).encode(), where="x")


def test_construction_validates() -> None:
    with pytest.raises(ConfigError, match=r"Manifest.metadata must be JSON-serializable"):
        make(metadata={"path": Path("/x")})
    with pytest.raises(ConfigError, match=r"Manifest.metrics=.* must be a dict with str keys"):
        make(metrics={1: 2})
    with pytest.raises(ConfigError, match=r"Manifest.report_index=-1 must be None or an int"):
        make(report_index=-1)
    with pytest.raises(ConfigError, match=r"Manifest.files\['a'\]=3 must be a FileEntry"):
        make(files={"a": 3})
    with pytest.raises(UnsafePathError, match="is not in normal form; use 'a/b'"):
        make(files={"a//b": ENTRY})
    with pytest.raises(ConfigError, match="must not list the manifest itself"):
        make(files={MANIFEST_NAME: ENTRY})
    with pytest.raises(ConfigError, match=r"Manifest.ranks=\[0\] must be a tuple"):
        make(ranks=[0])


def test_read_and_write_on_storage(tmp_path: Path) -> None:
    ckpt = resolve(str(tmp_path / "checkpoint_000007"))
    assert read_manifest(ckpt) is None  # Absent: not committed.
    write_manifest(ckpt, make())
    assert fileio.list_files(ckpt) == {MANIFEST_NAME: len(make().to_json())}
    manifest = read_manifest(ckpt)
    assert manifest is not None and manifest.report_index == 7


def test_read_damaged_manifest_names_its_location(tmp_path: Path) -> None:
    ckpt = resolve(str(tmp_path / "ck"))
    fileio.write_bytes_atomic(ckpt.join(MANIFEST_NAME), b"truncated{")
    with pytest.raises(ManifestError, match=rf"manifest .*ck/{MANIFEST_NAME} is not valid JSON"):
        read_manifest(ckpt)


def test_target_path_round_trips_and_old_manifests_read() -> None:
    manifest = make(target_path="/data/refs/ckpt")
    again = Manifest.from_json(manifest.to_json(), where="test")
    assert again.target_path == "/data/refs/ckpt" and again.target_uri is None
    old = json.loads(make().to_json())
    del old["target_path"]
    assert Manifest.from_json(json.dumps(old).encode(), where="old").target_path is None


@pytest.mark.parametrize(
    "bad", ["relative/x", "/a/../b", "/a//b", "/a/", "//a", "/a\x00b", "/a\\b"]
)
def test_target_path_must_be_normalized_absolute(bad: str) -> None:
    with pytest.raises(UnsafePathError, match=r"Manifest\.target_path=.* is not a normalized "
                       r"absolute path"):
        make(target_path=bad)
    document = json.loads(make().to_json())
    document["target_path"] = bad
    with pytest.raises(ManifestError,
                       match=r"The manifest there is invalid: field 'target_path' is .*; expected "
                       r"null or a normalized absolute path such as '/data/ckpt'\."):
        Manifest.from_json(json.dumps(document).encode(), where="there")


def test_target_path_and_target_uri_exclude_each_other() -> None:
    with pytest.raises(ConfigError, match="are both set; a reference has one location"):
        make(target_path="/data/x", target_uri="s3://b/x")


def test_keys_that_are_not_plain_str_in_a_plain_dict_are_checked_one_by_one() -> None:
    # A dict subclass may iterate over other keys than its items, and a str subclass may
    # hash other than it compares: neither gets past the checks made all at once.
    class OtherKeys(dict):  # type: ignore[type-arg]
        def __iter__(self) -> Any:
            return iter(["ok"])

    class HashedApart(str):
        def __hash__(self) -> int:
            return 0

        __eq__ = str.__eq__

    with pytest.raises(UnsafePathError, match=r"contains a '\.\.' component"):
        make(files=OtherKeys({"../evil": ENTRY}))
    with pytest.raises(ConfigError, match=r"must not list the manifest itself"):
        make(files={HashedApart("_cairn_manifest.json"): ENTRY})
