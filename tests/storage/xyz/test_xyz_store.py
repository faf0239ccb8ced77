"""The xyz store itself (examples/xyzstorage): URIs, the entry point, atomicity, snapshot
reads, threads, processes, error conversion. The conformance suite runs on it through
tests/storage/test_conformance.py (storage kind ``xyz``)."""

from __future__ import annotations

import io
import os
import pickle
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import cairn
from cairn.storage import TransientStorageError, export_registrations, registered_schemes, resolve

xyzstorage = pytest.importorskip("xyzstorage", reason="pip install -e examples/xyzstorage")
from xyzstorage.cairn_plugin import XyzStore, store_from_uri  # noqa: E402
from xyzstorage.client import Client, ObjectNotFound, StoreBusy  # noqa: E402


@pytest.fixture
def db(tmp_path: Path) -> str:
    return str(tmp_path / "store" / "xyz.db")


# --- URIs ------------------------------------------------------------------------------


def test_uri_names_the_database_and_the_key(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert xyzstorage.parse_uri(f"xyz://bucket/a/b/?db={db}") == (db, "bucket/a/b")
    assert xyzstorage.parse_uri("xyz://b/k?db=/x/my%20store.db") == ("/x/my store.db", "b/k")
    monkeypatch.setenv("XYZ_STORE_DB", db)
    assert xyzstorage.parse_uri("xyz://bucket/k") == (db, "bucket/k")
    assert xyzstorage.parse_uri("xyz://bucket/k?db=/other.db") == ("/other.db", "bucket/k")


@pytest.mark.parametrize(("uri", "match"), [
    ("s3://bucket/k?db=/x.db", "is not an xyz:// URI"),
    ("xyz://bucket/k", "names no database.*XYZ_STORE_DB"),
    ("xyz://bucket/k?db=relative.db", "must be an absolute path"),
    ("xyz://bucket/k?db=/x.db&dp=1", r"unknown query parameters \['dp'\]"),
])
def test_bad_uris_are_refused_with_the_fix(
    uri: str, match: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("XYZ_STORE_DB", raising=False)
    with pytest.raises(ValueError, match=match):
        xyzstorage.parse_uri(uri)


def test_cairn_finds_the_scheme_through_the_entry_point(db: str) -> None:
    assert "xyz" in registered_schemes()
    assert "xyz" not in export_registrations()  # nothing registered in code
    location = resolve(f"xyz://bucket/run?db={db}")
    assert location.path == "bucket/run"
    assert location.reachable_from_new_process
    # One store per database, whatever the URI: Cairn compares stores by identity.
    assert store_from_uri(f"xyz://other/key?db={db}") is store_from_uri(f"xyz://b?db={db}")
    assert resolve(f"xyz://bucket/run?db={db}") == location
    store = store_from_uri(f"xyz://b?db={db}")
    assert pickle.loads(pickle.dumps(store)) is store


def test_a_fresh_process_reads_a_checkpoint_from_its_uri_alone(db: str, tmp_path: Path) -> None:
    client = xyzstorage.connect(db)
    client.put("ckpts/step_1/model.bin", b"weights")
    client.put("ckpts/step_1/nested/opt.bin", b"")
    code = (
        "import os, sys, cairn\n"
        "with cairn.Checkpoint(sys.argv[1]).as_directory() as d:\n"
        "    for root, _, names in sorted(os.walk(d)):\n"
        "        for n in sorted(names):\n"
        "            p = os.path.join(root, n)\n"
        "            print(os.path.relpath(p, d), open(p, 'rb').read())\n"
    )
    out = subprocess.run([sys.executable, "-c", code, f"xyz://ckpts/step_1?db={db}"],
                         capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    assert out.splitlines() == ["model.bin b'weights'", "nested/opt.bin b''"]


# --- the client --------------------------------------------------------------------------


def test_objects_of_any_size_stream_in_chunks_and_seek(db: str) -> None:
    client = Client(db, chunk_size=1000)
    data = os.urandom(10_500)
    assert client.put("b/big", io.BytesIO(data)) == len(data)
    client.put("b/empty", b"")
    assert client.get("b/big") == data and client.get("b/empty") == b""
    with client.open("b/big") as stream:
        assert stream.seekable()
        stream.seek(9_990)
        assert stream.read(20) == data[9_990:10_010]
        stream.seek(-5, io.SEEK_END)
        assert stream.read() == data[-5:]
        buffer = bytearray(1500)
        stream.seek(0)
        assert stream.readinto(buffer) == 1000  # one chunk at a time
    assert client.scan("b/") == [("b/big", 10_500), ("b/empty", 0)]
    assert client.scan("b/e") == [("b/empty", 0)] and client.scan("c") == []
    assert client.size("b/big") == 10_500 and client.size("b/nope") is None
    with sqlite3.connect(db) as raw:
        assert raw.execute("SELECT COUNT(*) FROM chunks").fetchone()[0] == 11


def test_a_reader_keeps_its_version_while_the_object_is_replaced(db: str) -> None:
    client = Client(db, chunk_size=4)
    client.put("k", b"old version!")
    with client.open("k") as stream:
        assert stream.read(4) == b"old "
        client.put("k", b"NEW")
        assert stream.read() == b"version!"
        client.delete("k")
        stream.seek(0)
        assert stream.read() == b"old version!"
    with pytest.raises(ObjectNotFound, match="no object 'k'"):
        client.get("k")
    assert client.delete("k") is False


def test_a_writer_killed_mid_write_leaves_the_old_object(db: str) -> None:
    xyzstorage.connect(db).put("k", b"committed")
    # A child process writes a big object from a slow stream and is killed midway.
    code = (
        "import sys, time, xyzstorage\n"
        "class Slow:\n"
        "    def read(self, n):\n"
        "        print('writing', flush=True); time.sleep(0.05); return b'x' * n\n"
        "xyzstorage.connect(sys.argv[1]).put('k', Slow())\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code, db], stdout=subprocess.PIPE)
    assert child.stdout is not None
    child.stdout.readline()
    child.stdout.readline()
    child.send_signal(signal.SIGKILL)
    child.wait()
    client = Client(db, busy_timeout_s=5)
    assert client.get("k") == b"committed"
    client.put("k", b"after")  # the dead writer's lock is gone
    assert client.get("k") == b"after"


def test_threads_and_processes_write_concurrently(db: str) -> None:
    code = (
        "import sys, xyzstorage\n"
        "c = xyzstorage.connect(sys.argv[1])\n"
        "for i in range(30):\n"
        "    c.put(f'p{sys.argv[2]}/{i}', bytes([i]) * (i * 997))\n"
    )
    children = [subprocess.Popen([sys.executable, "-c", code, db, str(n)]) for n in range(3)]
    client = xyzstorage.connect(db)
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for i in range(30):
                client.put(f"t{n}/{i}", bytes([i]) * (i * 997))
                assert client.get(f"t{n}/{i}") == bytes([i]) * (i * 997)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [child.wait() for child in children] == [0, 0, 0]
    assert errors == []
    for prefix in ["t0", "t1", "t2", "t3", "p0", "p1", "p2"]:
        found = dict(client.scan(prefix + "/"))
        assert found == {f"{prefix}/{i}": i * 997 for i in range(30)}
        assert all(client.get(f"{prefix}/{i}") == bytes([i]) * (i * 997) for i in range(30))


# --- the Cairn adapter -------------------------------------------------------------------


def test_the_adapter_converts_the_clients_errors(db: str) -> None:
    store = XyzStore(Client(db, busy_timeout_s=0.05))
    with pytest.raises(FileNotFoundError):
        store.open_read("missing")
    assert store.stat("missing") is None
    store.delete("missing")
    store.write("k", io.BytesIO(b"v"))
    other = sqlite3.connect(db, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    try:
        started = time.monotonic()
        with pytest.raises(TransientStorageError, match="busy"):
            store.write("k", io.BytesIO(b"w"))
        assert time.monotonic() - started < 5
        with pytest.raises(StoreBusy):
            store.client.delete("k")
        assert store.open_read("k").read() == b"v"  # readers are never blocked
    finally:
        other.execute("ROLLBACK")
        other.close()
    store.write("k", io.BytesIO(b"w"))
    assert store.open_read("k").read() == b"w"


def test_a_checkpoint_in_the_store_round_trips(db: str, tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "w.bin").write_bytes(os.urandom(3 << 20))
    (source / "meta.json").write_text("{}")
    client = xyzstorage.connect(db)
    for path in source.rglob("*"):
        if path.is_file():
            client.put(f"b/ck/{path.relative_to(source).as_posix()}", path.read_bytes())
    checkpoint = cairn.Checkpoint(f"xyz://b/ck?db={db}")
    target = checkpoint.to_directory(str(tmp_path / "out"))
    assert (Path(target) / "sub" / "w.bin").read_bytes() == (source / "sub" / "w.bin").read_bytes()
    assert (Path(target) / "meta.json").read_text() == "{}"
