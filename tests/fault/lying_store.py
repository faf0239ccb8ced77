"""A custom store that lies, registered as ``lying://``: over any storage backend of the
conformance suite (a local directory, S3, the xyz plugin, ...), reached by its URI.

URI: ``lying://store?inner=<URI of the real backend>&control=<directory>``

It lies the ways a store whose client turns a timeout into "nothing" does, or an
eventually consistent S3-compatible store:

* ``not_found``: an object that exists is answered as missing (read and stat);
* ``unlisted``: an object that exists is left out of listings;
* ``drop``: a write is acknowledged and nothing is kept;
* ``lost_answer``: a write is kept and its answer is lost (the client raises
  ``ConnectionResetError``).

The lies are rules in ``<control>/rules.json`` (:func:`add_rule`), shared by the driver,
its worker processes and a restarted driver: a rule applies to keys containing ``match``,
at most ``times`` times in all (counted in files under ``<control>``, across processes),
or, with ``ratio``, to that share of the calls on a key, at most ``per_key`` lies in a
row for one key (a transient lie: the store tells the truth after that).
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import random
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO

import pyarrow.fs as pafs

from cairn.storage import ObjectInfo, register_scheme, resolve

SCHEME = "lying"


def lying_uri(inner: str, control: str) -> str:
    """The ``lying://`` URI of the backend at ``inner``, with its lies in ``control``."""
    os.makedirs(control, exist_ok=True)
    return f"{SCHEME}://store?" + urllib.parse.urlencode({"inner": inner, "control": control})


def add_rule(control: str, kind: str, match: str, *, times: int | None = None,
             ratio: float | None = None, per_key: int = 3) -> None:
    """Add a lie: ``kind`` is ``not_found``, ``unlisted``, ``drop`` or ``lost_answer``."""
    assert kind in ("not_found", "unlisted", "drop", "lost_answer"), kind
    os.makedirs(control, exist_ok=True)
    with _locked(control):
        rules = _rules(control)
        rules.append({"id": len(rules), "kind": kind, "match": match, "times": times,
                      "ratio": ratio, "per_key": per_key})
        _write_json(os.path.join(control, "rules.json"), rules)


def lies_told(control: str) -> dict[str, int]:
    """How many lies of each kind were told so far, by every process."""
    with _locked(control):
        counts = _counts(control)
    told: dict[str, int] = {}
    for rule in _rules(control):
        told[rule["kind"]] = told.get(rule["kind"], 0) + counts.get(str(rule["id"]), 0)
    return told


def _rules(control: str) -> list[dict[str, Any]]:
    try:
        with open(os.path.join(control, "rules.json")) as f:
            rules: list[dict[str, Any]] = json.load(f)
    except FileNotFoundError:
        return []
    return rules


def _counts(control: str) -> dict[str, int]:
    try:
        with open(os.path.join(control, "counts.json")) as f:
            counts: dict[str, int] = json.load(f)
    except FileNotFoundError:
        return {}
    return counts


def _write_json(path: str, value: object) -> None:
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w") as f:
        json.dump(value, f)
    os.replace(temporary, path)


@contextmanager
def _locked(control: str) -> Iterator[None]:
    with open(os.path.join(control, "lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class LyingStore:
    """An ``ObjectStore`` over the storage at ``inner`` (any URI Cairn resolves)."""

    def __init__(self, inner: str, control: str) -> None:
        self.inner_uri = inner
        self.control = control
        location = resolve(inner)
        self._fs = location.filesystem
        self._base = location.path.rstrip("/")
        self._random = random.Random(os.getpid())

    def _lies(self, kind: str, key: str) -> bool:
        """Whether to lie about ``key`` now (counts the lie, across processes)."""
        rules = [r for r in _rules(self.control) if r["kind"] == kind and r["match"] in key]
        if not rules:
            return False
        with _locked(self.control):
            counts = _counts(self.control)
            lie = False
            for rule in rules:
                rule_id = str(rule["id"])
                if rule["ratio"] is not None:
                    streak_id = f"{rule_id}:{hashlib.sha1(key.encode()).hexdigest()[:16]}"
                    streak = counts.get(streak_id, 0)
                    lie = streak < rule["per_key"] and self._random.random() < rule["ratio"]
                    counts[streak_id] = streak + 1 if lie else 0
                else:
                    lie = rule["times"] is None or counts.get(rule_id, 0) < rule["times"]
                if lie:
                    counts[rule_id] = counts.get(rule_id, 0) + 1
                    break
            _write_json(os.path.join(self.control, "counts.json"), counts)
        return lie

    def _path(self, key: str) -> str:
        return f"{self._base}/{key}" if self._base else key

    def open_read(self, key: str) -> BinaryIO:
        if self._lies("not_found", key):
            raise FileNotFoundError(f"no object {key!r} (a lie)")
        with self._fs.open_input_stream(self._path(key)) as stream:
            return io.BytesIO(stream.read())

    def write(self, key: str, stream: BinaryIO) -> None:
        data = stream.read()
        if self._lies("drop", key):
            return
        path = self._path(key)
        if self._fs.type_name == "local":
            self._fs.create_dir(path.rpartition("/")[0], recursive=True)
        with self._fs.open_output_stream(path) as out:
            out.write(data)
        if self._lies("lost_answer", key):
            raise ConnectionResetError(f"writing {key!r}: connection reset (a lie)")

    def list(self, prefix: str) -> list[ObjectInfo]:
        selector = pafs.FileSelector(self._base or "/", allow_not_found=True, recursive=True)
        base = self._base.lstrip("/")
        found = []
        for info in self._fs.get_file_info(selector):
            if info.type != pafs.FileType.File:
                continue
            key = info.path.lstrip("/")[len(base):].lstrip("/")
            if key.startswith(prefix) and not self._lies("unlisted", key):
                found.append(ObjectInfo(key, int(info.size or 0)))
        return sorted(found)

    def delete(self, key: str) -> None:
        try:
            self._fs.delete_file(self._path(key))
        except FileNotFoundError:
            pass

    def stat(self, key: str) -> ObjectInfo | None:
        info = self._fs.get_file_info(self._path(key))
        if info.type != pafs.FileType.File or self._lies("not_found", key):
            return None
        return ObjectInfo(key, int(info.size or 0))


def lying_factory(uri: str) -> LyingStore:
    options = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(uri).query))
    return LyingStore(options["inner"], options["control"])


def register() -> None:
    register_scheme(SCHEME, lying_factory, overwrite=True)
