"""Shared fixtures: storage backends every test suite can run against.

* ``s3_uri_factory``: a real S3-protocol server (moto) on 127.0.0.1, started once per
  session; ``s3_uri_factory("prefix")`` returns a fresh ``s3://`` URI on it.
* ``storage_uri``: a fresh, empty base URI, parametrized over ``local``, ``memory``
  (fsspec, in-process), ``s3`` (moto), ``dictstore`` (a custom ``ObjectStore`` over a
  dict, registered under the ``dictstore://`` scheme, in-process) and ``xyz`` (the example
  plugin ``examples/xyzstorage``: a SQLite file, found through its entry point).

``memory`` and ``dictstore`` live in the test process only: worker processes see empty
stores there.
"""

from __future__ import annotations

import io
import logging
import os
import sys
import threading
import urllib.parse
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

import pytest

import cairn

# Helpers shared by tests in different folders (imported as top-level modules).
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "support"))
from cairn.storage import ObjectInfo, register_scheme

# Fixtures shared by test folders, from tests/support (on the path above).
pytest_plugins = ["copy_process_fixtures"]

# The driver's live view stays quiet in tests; tests of the view turn it on with
# RunConfig(progress=1 | 2).
os.environ.setdefault("CAIRN_PROGRESS", "0")
# Ray starts its worker processes at niceness 15 by default: beside any process of normal
# priority that keeps a core busy (another test run, a CPU hog), the tests' Ray actors get
# a small fraction of the CPU and a Ray test that takes seconds took over 300 s. Every Ray
# cluster the tests start (in this process or in subprocesses, which inherit this) runs
# its workers at normal priority instead.
os.environ.setdefault("RAY_worker_niceness", "0")
# Every Ray cluster the tests start binds to 127.0.0.1, so no test traffic uses the machine's
# network interface. Ray picks the loopback address for its nodes (GCS, raylets, workers)
# when multi-host clusters are off; `node_ip_address="127.0.0.1"` alone is not enough, as
# Ray resolves a loopback address to the interface's for a cluster. Set here, before any
# ray.init(), so every cluster_utils node and every subprocess driver inherits it.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

S3_BUCKET = "cairn-test"
DICTSTORE_SCHEME = "dictstore"
_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


class DictStore:
    """An ``ObjectStore`` keeping objects in a dict; thread-safe. Counts calls per method."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()

    def _count(self, method: str) -> None:
        with self._lock:
            self.calls[method] = self.calls.get(method, 0) + 1

    def open_read(self, key: str) -> BinaryIO:
        self._count("open_read")
        with self._lock:
            data = self.objects.get(key)
        if data is None:
            raise FileNotFoundError(f"no object {key!r}")
        return io.BytesIO(data)

    def write(self, key: str, stream: BinaryIO) -> None:
        self._count("write")
        data = stream.read()
        with self._lock:
            self.objects[key] = bytes(data)

    def list(self, prefix: str) -> Iterable[ObjectInfo]:
        self._count("list")
        with self._lock:
            items = sorted(self.objects.items())
        return [ObjectInfo(key, len(data)) for key, data in items if key.startswith(prefix)]

    def delete(self, key: str) -> None:
        self._count("delete")
        with self._lock:
            self.objects.pop(key, None)

    def stat(self, key: str) -> ObjectInfo | None:
        self._count("stat")
        with self._lock:
            data = self.objects.get(key)
        return None if data is None else ObjectInfo(key, len(data))


DICT_STORE = DictStore()


def dictstore_factory(uri: str) -> DictStore:
    """``dictstore://a/b`` -> key prefix ``a/b`` of the one process-wide :data:`DICT_STORE`."""
    return DICT_STORE


@pytest.fixture(scope="session")
def dict_store() -> DictStore:
    """The store behind ``dictstore://`` URIs (registered for the session)."""
    register_scheme(DICTSTORE_SCHEME, dictstore_factory, overwrite=True)
    return DICT_STORE


@pytest.fixture(scope="session")
def new_dict_store() -> Callable[[], DictStore]:
    """Makes fresh, unregistered :class:`DictStore` instances (tests need not import it)."""
    return DictStore


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """``host:port`` of a moto S3 server on loopback, with bucket ``cairn-test``."""
    moto_server = pytest.importorskip("moto.server")
    saved = {name: os.environ.get(name) for name in _AWS_ENV}
    os.environ.update(_AWS_ENV)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"{host}:{port}"
    import boto3

    boto3.client(
        "s3", endpoint_url=f"http://{endpoint}", region_name="us-east-1"
    ).create_bucket(Bucket=S3_BUCKET)
    try:
        yield endpoint
    finally:
        server.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture(scope="session")
def s3_uri_factory(s3_endpoint: str) -> Callable[[str], str]:
    """``make(prefix)`` -> a fresh ``s3://cairn-test/<prefix>-<random>?...`` URI on moto."""

    def make(prefix: str) -> str:
        name = f"{prefix.strip('/')}-{uuid.uuid4().hex[:10]}"
        return (
            f"s3://{S3_BUCKET}/{name}?endpoint_override={s3_endpoint}&scheme=http"
            "&region=us-east-1"
        )

    return make


STORAGE_KINDS = ("local", "memory", "s3", "dictstore", "xyz")


@pytest.fixture(params=STORAGE_KINDS)
def storage_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty base URI on each kind of storage (see the module docstring)."""
    return make_storage_uri(request, str(request.param), tmp_path)


def make_storage_uri(request: pytest.FixtureRequest, kind: str, tmp_path: Path) -> str:
    """A fresh base URI of ``kind`` (one of :data:`STORAGE_KINDS`)."""
    unique = uuid.uuid4().hex[:10]
    if kind == "local":
        return str(tmp_path / f"storage-{unique}")
    if kind == "memory":
        return f"memory://cairn-tests/{unique}"
    if kind == "s3":
        factory: Callable[[str], str] = request.getfixturevalue("s3_uri_factory")
        return factory("storage")
    if kind == "dictstore":
        request.getfixturevalue("dict_store")
        return f"{DICTSTORE_SCHEME}://bucket/{unique}"
    if kind == "xyz":
        pytest.importorskip("xyzstorage", reason="pip install -e examples/xyzstorage")
        db = urllib.parse.quote(str(tmp_path / "xyz.db"), safe="/")
        return f"xyz://bucket/{unique}?db={db}"
    raise ValueError(f"kind={kind!r} is not one of {STORAGE_KINDS}")


# What torch.distributed, Lightning and a local-mode TorchTrainer (Accelerate on CPUs) set
# in the process they run in.
_GROUP_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
              "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "ACCELERATE_USE_CPU")


@pytest.fixture(autouse=True)
def no_process_group_outlives_a_test() -> Iterator[None]:
    """Local-mode tests (num_workers=0: Ray's ported ones, the Lightning helper's) run
    Lightning's DDP strategy in this process, which joins a process group, sets torchrun's
    variables here and leaves both behind, as in any process it runs in; later tests then
    met a group they did not start. Each test ends with neither."""
    saved = {name: os.environ.get(name) for name in _GROUP_ENV}
    yield
    # No group can exist where no test imported torch.distributed: importing it here
    # would put torch's import into the run of every test that never needs it.
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


# --- training runs ---------------------------------------------------------------------


@pytest.fixture
def run_config(tmp_path: Path) -> Callable[..., cairn.RunConfig]:
    """A RunConfig on a fresh local storage path; keyword arguments override fields."""

    def make(**overrides: object) -> cairn.RunConfig:
        fields: dict[str, object] = {"name": "run", "storage_path": str(tmp_path / "storage")}
        fields.update(overrides)
        return cairn.RunConfig(**fields)  # type: ignore[arg-type]

    return make


@pytest.fixture
def scratch(tmp_path: Path) -> str:
    """A directory workers can use to leave files for the test to inspect."""
    path = tmp_path / "scratch"
    path.mkdir()
    return str(path)


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The paths fsynced in this process from now on, in order (what each descriptor
    names then)."""
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("reads /proc/self/fd")
    calls: list[str] = []
    original = os.fsync

    def recording(fd: int) -> None:
        calls.append(os.readlink(f"/proc/self/fd/{fd}"))
        original(fd)

    monkeypatch.setattr(os, "fsync", recording)
    yield calls


def pytest_collection_finish(session: pytest.Session) -> None:
    # Worker processes import this module's storage factories as `conftest`: another
    # conftest.py in a directory without __init__.py takes that name and they fail to
    # unpickle. Each test directory with a conftest.py must be a package.
    module = sys.modules.get("conftest")
    if module is not None and getattr(module, "__file__", None) != __file__:
        raise pytest.UsageError(
            f"{module.__file__} was imported as 'conftest', shadowing {__file__}: add an "
            "__init__.py to its directory."
        )
